/*
 * tests/fuzz.h: what the hostile-input harnesses (tests/fuzz_<name>.c)
 * share. Each harness is one libFuzzer entry point that feeds a buffer to
 * a real parser of bytes from outside (a hostfile, a handshake message, a
 * checkpoint manifest, a data file) and checks what it answers: an input
 * is either accepted, and then consistent, or refused with a message that
 * names what and where. A broken rule is an abort(), which libFuzzer and
 * the replay both report.
 *
 * Built two ways:
 *   - make check: with tests/fuzz_main.c as main (any compiler), which
 *     replays the harness's cases, tests/fuzz-corpus/<name>.txt (seeds and
 *     every input a fuzzing run found), as TAP, each against the message
 *     it expects; also under scripts/check-sanitize.sh.
 *   - scripts/fuzz.sh NAME SECONDS: with clang's libFuzzer, ASan and UBSan
 *     (FUZZ_LIBFUZZER defined: no main here), seeded from the same cases.
 */
#ifndef MESH_TESTS_FUZZ_H
#define MESH_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len);

/* The harness's name (its corpus is tests/fuzz-corpus/<name>.txt). */
extern const char fuzz_name[];

/*
 * What the last input came to, for the replay: fuzz_rc 0 (accepted) or
 * the parser's negative code, fuzz_msg its message ("" when accepted).
 */
extern int fuzz_rc;
extern char fuzz_msg[1024];

/*
 * Record a parser's answer rc (and its message, mesh_err_msg): a refusal
 * must carry a message that contains each of the n strings in must (what
 * and where: a file's name, "line", ...), else abort.
 */
void fuzz_answer(int rc, const char *const *must, int n);

/* abort() with a line on stderr: a harness's broken invariant. */
void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A private temporary directory for the process (file-based parsers),
 * emptied by the harness between inputs; removed at exit. */
const char *fuzz_tmpdir(void);

/* Write len bytes to fuzz_tmpdir()/name (folders in name created). */
void fuzz_write(const char *name, const void *data, size_t len);

/* Empty fuzz_tmpdir(). */
void fuzz_clean(void);

#endif
