// CPUID with AVX-512 and AMX hidden, for benchmarks/cpuid_mask.py: the machine as an AVX2-only CPU (an AMD
// EPYC of the Zen 2/3 kind) looks to a library that picks its kernels by CPUID (ONNX Runtime's MLAS, and its
// cpuinfo), where that library has no switch of its own.
//
// How: Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID 0, where /proc/cpuinfo lists cpuid_fault) makes
// the CPUID instruction raise SIGSEGV in the calling thread and in the threads it creates from then on. The
// handler below runs the real CPUID (faulting off for the moment), clears the feature bits of AVX-512, AMX
// and the VEX-encoded VNNI/IFMA, writes the result into the interrupted registers and steps over the
// instruction. Any other SIGSEGV goes to the handler that was there before.
// What it is not: a guard. Code that reads XCR0 (XGETBV) or that decided before the mask went on still
// sees the real machine.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static struct sigaction previous;
static volatile long trapped = 0;

static long arch_prctl_(int code, unsigned long arg) { return syscall(SYS_arch_prctl, code, arg); }

static void cpuid_real(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}

static void mask(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  if (leaf == 7 && sub == 0) {
    // EBX: AVX512F 16, DQ 17, IFMA 21, PF 26, ER 27, CD 28, BW 30, VL 31
    r[1] &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31));
    // ECX: VBMI 1, VBMI2 6, VNNI 11, BITALG 12, VPOPCNTDQ 14
    r[2] &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
    // EDX: 4VNNIW 2, 4FMAPS 3, VP2INTERSECT 8, AMX-BF16 22, AVX512_FP16 23, AMX-TILE 24, AMX-INT8 25
    r[3] &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25));
  } else if (leaf == 7 && sub == 1) {
    // EAX: AVX-VNNI 4, AVX512_BF16 5, AMX-FP16 21, AVX-IFMA 23 (none on Zen 2/3)
    r[0] &= ~((1u << 4) | (1u << 5) | (1u << 21) | (1u << 23));
  } else if (leaf == 0xd && sub == 0) {
    r[0] &= ~(uint32_t)0x600e0;  // supported XSAVE state: no opmask/ZMM (5-7), no tile config/data (17-18)
  }
}

static void on_segv(int sig, siginfo_t* info, void* ctx) {
  ucontext_t* uc = (ucontext_t*)ctx;
  const uint8_t* ip = (const uint8_t*)uc->uc_mcontext.gregs[REG_RIP];
  if (info->si_code != SI_KERNEL || ip == NULL || ip[0] != 0x0f || ip[1] != 0xa2) {
    sigaction(SIGSEGV, &previous, NULL);  // not ours: returning re-runs the instruction under the old handler
    (void)sig;
    return;
  }
  uint32_t r[4];
  const uint32_t leaf = (uint32_t)uc->uc_mcontext.gregs[REG_RAX], sub = (uint32_t)uc->uc_mcontext.gregs[REG_RCX];
  arch_prctl_(ARCH_SET_CPUID, 1);
  cpuid_real(leaf, sub, r);
  arch_prctl_(ARCH_SET_CPUID, 0);
  mask(leaf, sub, r);
  uc->uc_mcontext.gregs[REG_RAX] = r[0];
  uc->uc_mcontext.gregs[REG_RBX] = r[1];
  uc->uc_mcontext.gregs[REG_RCX] = r[2];
  uc->uc_mcontext.gregs[REG_RDX] = r[3];
  uc->uc_mcontext.gregs[REG_RIP] += 2;
  __atomic_add_fetch(&trapped, 1, __ATOMIC_RELAXED);
}

// Install the handler (once) and turn CPUID faulting on (1) or off (0) for the calling thread. Returns 0,
// or -1 where the kernel or CPU has no CPUID faulting.
int cpuid_mask_set(int on) {
  static int installed = 0;
  if (!installed) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &previous) != 0) return -1;
    installed = 1;
  }
  return arch_prctl_(ARCH_SET_CPUID, on ? 0 : 1) == 0 ? 0 : -1;
}

// CPUID instructions emulated so far (a check that the mask was met at all).
long cpuid_mask_trapped(void) { return __atomic_load_n(&trapped, __ATOMIC_RELAXED); }

// CPUID leaf 7 EBX as the calling thread sees it (for the self-check).
unsigned cpuid_mask_leaf7_ebx(void) {
  uint32_t r[4];
  cpuid_real(7, 0, r);
  return r[1];
}
