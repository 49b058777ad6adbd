dnl Optional dependencies. Each one follows the same rule (as UCX does):
dnl default "guess": look, and say "no" in the summary when it is absent;
dnl asked for explicitly (--with-X or --with-X=DIR) and absent: an error.

dnl MESH_WITH_ARG(name, help) -> sets with_<name> to guess|yes|no|DIR
AC_DEFUN([MESH_WITH_ARG], [
  AC_ARG_WITH([$1], [AS_HELP_STRING([--with-$1@<:@=DIR@:>@], [$2 (default: guess)])],
              [], [with_$1=guess])
])

dnl MESH_OPTIONAL_FAIL(name, what): error when asked for, otherwise "no".
AC_DEFUN([MESH_OPTIONAL_FAIL], [
  AS_IF([test "x$with_$1" != "xguess"],
        [AC_MSG_ERROR([--with-$1 was given but $2 was not found])])
])

AC_DEFUN([MESH_CHECK_ZLIB], [
  MESH_WITH_ARG([zlib], [zlib, for gzip-compressed data sets])
  mesh_have_zlib=no
  AS_IF([test "x$with_zlib" != "xno"], [
    PKG_CHECK_MODULES([ZLIB], [zlib], [mesh_have_zlib=yes],
                      [MESH_OPTIONAL_FAIL([zlib], [zlib])])])
  AS_IF([test "x$mesh_have_zlib" = "xyes"],
        [AC_DEFINE([HAVE_ZLIB], [1], [zlib is available])])
  AM_CONDITIONAL([HAVE_ZLIB], [test "x$mesh_have_zlib" = "xyes"])
])

AC_DEFUN([MESH_CHECK_JPEG], [
  MESH_WITH_ARG([jpeg], [libjpeg-turbo, for imagefolder data sets])
  mesh_have_jpeg=no
  AS_IF([test "x$with_jpeg" != "xno"], [
    PKG_CHECK_MODULES([JPEG], [libjpeg], [mesh_have_jpeg=yes],
                      [MESH_OPTIONAL_FAIL([jpeg], [libjpeg])])])
  AS_IF([test "x$mesh_have_jpeg" = "xyes"],
        [AC_DEFINE([HAVE_JPEG], [1], [libjpeg-turbo is available])])
  AM_CONDITIONAL([HAVE_JPEG], [test "x$mesh_have_jpeg" = "xyes"])
])

dnl oneDNN (libdnnl), the CPU backend of nn/.
AC_DEFUN([MESH_CHECK_DNNL], [
  MESH_WITH_ARG([dnnl], [oneDNN (libdnnl), the CPU compute backend])
  mesh_have_dnnl=no
  DNNL_CPPFLAGS=; DNNL_LDFLAGS=; DNNL_LIBS=
  AS_IF([test "x$with_dnnl" != "xno"], [
    AS_CASE([$with_dnnl], [guess|yes], [],
            [DNNL_CPPFLAGS="-I$with_dnnl/include"
             DNNL_LDFLAGS="-L$with_dnnl/lib -Wl,-rpath,$with_dnnl/lib"])
    save_CPPFLAGS=$CPPFLAGS; save_LDFLAGS=$LDFLAGS
    CPPFLAGS="$CPPFLAGS $DNNL_CPPFLAGS"; LDFLAGS="$LDFLAGS $DNNL_LDFLAGS"
    AC_CHECK_HEADER([oneapi/dnnl/dnnl.h],
      [AC_CHECK_LIB([dnnl], [dnnl_engine_create],
                    [mesh_have_dnnl=yes; DNNL_LIBS=-ldnnl], [:])])
    CPPFLAGS=$save_CPPFLAGS; LDFLAGS=$save_LDFLAGS
    AS_IF([test "x$mesh_have_dnnl" = "xno"],
          [MESH_OPTIONAL_FAIL([dnnl], [oneDNN (apt-get install libdnnl-dev)])])])
  AS_IF([test "x$mesh_have_dnnl" = "xyes"],
        [AC_DEFINE([HAVE_DNNL], [1], [oneDNN is available])])
  AC_SUBST([DNNL_CPPFLAGS])
  AC_SUBST([DNNL_LDFLAGS])
  AC_SUBST([DNNL_LIBS])
  AM_CONDITIONAL([HAVE_DNNL], [test "x$mesh_have_dnnl" = "xyes"])
])

dnl libibverbs + librdmacm (rdma-core), the verbs transport.
AC_DEFUN([MESH_CHECK_VERBS], [
  MESH_WITH_ARG([verbs], [libibverbs and librdmacm (rdma-core), the RDMA transport])
  mesh_have_verbs=no
  VERBS_CPPFLAGS=; VERBS_LDFLAGS=; VERBS_LIBS=
  AS_IF([test "x$with_verbs" != "xno"], [
    AS_CASE([$with_verbs], [guess|yes], [],
            [VERBS_CPPFLAGS="-I$with_verbs/include"
             VERBS_LDFLAGS="-L$with_verbs/lib -Wl,-rpath,$with_verbs/lib"])
    save_CPPFLAGS=$CPPFLAGS; save_LDFLAGS=$LDFLAGS
    CPPFLAGS="$CPPFLAGS $VERBS_CPPFLAGS"; LDFLAGS="$LDFLAGS $VERBS_LDFLAGS"
    AC_CHECK_HEADERS([infiniband/verbs.h rdma/rdma_cma.h],
      [mesh_verbs_hdr=yes], [mesh_verbs_hdr=no; break])
    AS_IF([test "x$mesh_verbs_hdr" = "xyes"],
      [AC_CHECK_LIB([ibverbs], [ibv_get_device_list],
        [AC_CHECK_LIB([rdmacm], [rdma_create_event_channel],
           [mesh_have_verbs=yes; VERBS_LIBS="-lrdmacm -libverbs"], [:])],
        [:])])
    CPPFLAGS=$save_CPPFLAGS; LDFLAGS=$save_LDFLAGS
    AS_IF([test "x$mesh_have_verbs" = "xno"],
          [MESH_OPTIONAL_FAIL([verbs],
             [libibverbs/librdmacm (apt-get install libibverbs-dev librdmacm-dev)])])])
  AS_IF([test "x$mesh_have_verbs" = "xyes"],
        [AC_DEFINE([HAVE_VERBS], [1], [rdma-core verbs are available])])
  AC_SUBST([VERBS_CPPFLAGS])
  AC_SUBST([VERBS_LDFLAGS])
  AC_SUBST([VERBS_LIBS])
  AM_CONDITIONAL([HAVE_VERBS], [test "x$mesh_have_verbs" = "xyes"])
])
