/* Included before every native source (setup.py: -include): the symbols whose current glibc
 * versions are newer than glibc 2.28 are bound to their old versions, which every glibc since
 * keeps, so the helper library loads into a job whose glibc is as old as 2.28 (a manylinux_2_28
 * wheel; `auditwheel show` checks it, tests/integration/test_wheel_old_glibc.py loads it into a
 * job on Debian bullseye). The executables are linked statically instead (setup.py): their C
 * start-up code references __libc_start_main@GLIBC_2.34, which no directive here can move. */
/* setup.py includes it only when the C library is glibc; the versions named are x86-64's. */
#if defined(__x86_64__) && !defined(PROBING_GLIBC_COMPAT_H)
#define PROBING_GLIBC_COMPAT_H
__asm__(".symver dladdr,dladdr@GLIBC_2.2.5");
__asm__(".symver dlsym,dlsym@GLIBC_2.2.5");
__asm__(".symver dlopen,dlopen@GLIBC_2.2.5");
__asm__(".symver dlerror,dlerror@GLIBC_2.2.5");
__asm__(".symver pthread_create,pthread_create@GLIBC_2.2.5");
__asm__(".symver pthread_detach,pthread_detach@GLIBC_2.2.5");
__asm__(".symver pthread_join,pthread_join@GLIBC_2.2.5");
__asm__(".symver pthread_setname_np,pthread_setname_np@GLIBC_2.12");
__asm__(".symver pthread_sigmask,pthread_sigmask@GLIBC_2.2.5");
#endif
