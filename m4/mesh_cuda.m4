dnl The CUDA toolkit with cuDNN and cuBLAS: the GPU backend of nn/.
dnl --with-cuda[=DIR] (default guess at /usr/local/cuda), --with-cuda-arch.
AC_DEFUN([MESH_CHECK_CUDA], [
  MESH_WITH_ARG([cuda], [the CUDA toolkit with cuDNN and cuBLAS (DIR defaults to /usr/local/cuda)])
  AC_ARG_WITH([cuda-arch],
    [AS_HELP_STRING([--with-cuda-arch=LIST],
                    [GPU architectures to build machine code for, PTX added for the newest (default: sm_80,sm_90)])],
    [], [with_cuda_arch=sm_80,sm_90])
  mesh_have_cuda=no
  mesh_cuda_summary=
  CUDA_CPPFLAGS=; CUDA_LDFLAGS=; CUDA_LIBS=; NVCC_ARCH_FLAGS=
  AS_IF([test "x$with_cuda" != "xno"], [
    AS_CASE([$with_cuda], [guess|yes], [mesh_cuda_dir=/usr/local/cuda],
            [mesh_cuda_dir=$with_cuda])
    AC_PATH_PROG([NVCC], [nvcc], [no], [$mesh_cuda_dir/bin$PATH_SEPARATOR$PATH])
    CUDA_CPPFLAGS="-I$mesh_cuda_dir/include"
    CUDA_LDFLAGS="-L$mesh_cuda_dir/lib64 -Wl,-rpath,$mesh_cuda_dir/lib64"
    save_CPPFLAGS=$CPPFLAGS; save_LDFLAGS=$LDFLAGS
    CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS"; LDFLAGS="$LDFLAGS $CUDA_LDFLAGS"
    mesh_cuda_ok=yes
    AS_IF([test "x$NVCC" = "xno"], [mesh_cuda_ok=no])
    AS_IF([test "x$mesh_cuda_ok" = "xyes"],
      [AC_CHECK_HEADERS([cuda_runtime.h cudnn.h cublas_v2.h], [],
                        [mesh_cuda_ok=no; break])])
    dnl [:] as the found-action keeps these out of the global LIBS.
    AS_IF([test "x$mesh_cuda_ok" = "xyes"],
      [AC_CHECK_LIB([cudart], [cudaMalloc], [:], [mesh_cuda_ok=no])])
    AS_IF([test "x$mesh_cuda_ok" = "xyes"],
      [AC_CHECK_LIB([cublas], [cublasCreate_v2], [:], [mesh_cuda_ok=no])])
    AS_IF([test "x$mesh_cuda_ok" = "xyes"],
      [AC_CHECK_LIB([cudnn], [cudnnCreate], [:], [mesh_cuda_ok=no])])
    CPPFLAGS=$save_CPPFLAGS; LDFLAGS=$save_LDFLAGS
    AS_IF([test "x$mesh_cuda_ok" = "xyes"], [
      mesh_have_cuda=yes
      CUDA_LIBS="-lcudnn -lcublas -lcudart -lstdc++"
      dnl Machine code for each architecture listed, and PTX for the newest
      dnl (its plain compute_N: an "a" or "f" variant's PTX runs on no later
      dnl GPU), which the driver compiles for GPUs newer than the list.
      mesh_newest=0
      for mesh_arch in `echo "$with_cuda_arch" | tr ',' ' '`; do
        mesh_num=`echo "$mesh_arch" | sed 's/^sm_//'`
        AS_CASE([$mesh_num], [[[0-9]*]], [],
                [AC_MSG_ERROR([--with-cuda-arch: "$mesh_arch" is not sm_N])])
        NVCC_ARCH_FLAGS="$NVCC_ARCH_FLAGS -gencode arch=compute_$mesh_num,code=sm_$mesh_num"
        mesh_digits=`echo "$mesh_num" | sed 's/[[^0-9]].*//'`
        AS_IF([test "$mesh_digits" -gt "$mesh_newest"],
              [mesh_newest=$mesh_digits])
      done
      AS_IF([test "$mesh_newest" -eq 0],
            [AC_MSG_ERROR([--with-cuda-arch: no architecture in "$with_cuda_arch"])])
      NVCC_ARCH_FLAGS="$NVCC_ARCH_FLAGS -gencode arch=compute_$mesh_newest,code=compute_$mesh_newest"
      mesh_cuda_summary="($mesh_cuda_dir, $with_cuda_arch + PTX compute_$mesh_newest)"
    ], [MESH_OPTIONAL_FAIL([cuda], [the CUDA toolkit with cuDNN and cuBLAS])])
  ])
  AS_IF([test "x$mesh_have_cuda" = "xyes"],
        [AC_DEFINE([HAVE_CUDA], [1], [CUDA, cuDNN and cuBLAS are available])])
  AC_SUBST([CUDA_CPPFLAGS])
  AC_SUBST([CUDA_LDFLAGS])
  AC_SUBST([CUDA_LIBS])
  AC_SUBST([NVCC_ARCH_FLAGS])
  AM_CONDITIONAL([HAVE_CUDA], [test "x$mesh_have_cuda" = "xyes"])
])
