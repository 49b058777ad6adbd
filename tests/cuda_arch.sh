#!/bin/sh
# tests/cuda_arch.sh: what configure's --with-cuda-arch list puts in the
# CUDA objects (m4/mesh_cuda.m4): machine code (an ELF image) for each
# architecture listed, and PTX for the newest one, so that the driver can
# compile the kernels for GPUs newer than the list. Read from the build's
# own NVCC and NVCC_ARCH_FLAGS through `nvcc -dryrun`, which prints the
# fatbinary command and its images without compiling (cuobjdump may be
# missing from the toolkit). A TAP skip in a build without CUDA.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

B=${top_builddir:-$top_srcdir}
grep -q '^#define HAVE_CUDA 1' "$B/config.h" 2> /dev/null ||
    t_skip_all "built without CUDA (configure --with-cuda)"
NVCC=$(sed -n 's/^NVCC = //p' "$B/Makefile")
FLAGS=$(sed -n 's/^NVCC_ARCH_FLAGS = *//p' "$B/Makefile")
[ -x "$NVCC" ] || t_skip_all "no nvcc at \"$NVCC\""

t_plan 4
echo '__global__ void k(float *p) { p[threadIdx.x] = 1.f; }' > "$TMP/k.cu"
# shellcheck disable=SC2086
"$NVCC" -dryrun -c "$TMP/k.cu" -o "$TMP/k.o" $FLAGS > "$TMP/dry.log" 2>&1
t_ok $? "nvcc -dryrun with NVCC_ARCH_FLAGS ($FLAGS)"
grep -o 'image3=kind=[a-z]*,sm=[0-9a-z]*' "$TMP/dry.log" |
    sed 's/image3=kind=//; s/,sm=/ /' | sort -u > "$TMP/images"
t_diag "images: $(tr '\n' ';' < "$TMP/images")"

# the architectures the flags name as machine code (code=sm_N)
echo "$FLAGS" | tr ' ' '\n' | sed -n 's/.*code=sm_\([0-9a-z]*\)$/\1/p' |
    sort -u > "$TMP/listed"
missing=""
while read -r a; do
    grep -qx "elf $a" "$TMP/images" || missing="$missing sm_$a"
done < "$TMP/listed"
[ -s "$TMP/listed" ] && [ -z "$missing" ]
t_ok $? "an ELF image for each listed architecture ($(tr '\n' ' ' \
    < "$TMP/listed"))${missing:+, missing:$missing}"

newest=$(sed 's/[^0-9].*//' "$TMP/listed" | sort -n | tail -n 1)
ptx=$(sed -n 's/^ptx //p' "$TMP/images")
[ "$ptx" = "$newest" ]
t_ok $? "exactly one PTX image, for the newest: compute_$newest (got $ptx)"

# configure's summary says so too
grep -q "PTX compute_$newest" "$B/config.log"
t_ok $? "configure's summary names PTX compute_$newest"
t_done
