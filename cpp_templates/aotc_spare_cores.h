// How many of this process's cores other processes left free lately, from the kernel's per-CPU tick
// counters (/proc/stat): the pool's policy (aotc_pool.h) asks before it tries its workers again while it
// runs calls on one thread. A core that another process keeps busy makes a try cost a slow call; a core
// that has been free makes one likely to win.
// What it is not: a load average (that counts the whole machine, not the cores this process may use) or a
// prediction; it reports the recent past, and the policy still tries now and then whatever it says.
#ifndef AOTC_SPARE_CORES_H
#define AOTC_SPARE_CORES_H

#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <cmath>

// Clock ``c``'s reading in ns (-1 if it cannot be read): CLOCK_MONOTONIC, a thread's or the process's CPU time.
static inline int64_t aotc_clock_ns(clockid_t c) {
  timespec ts;
  return clock_gettime(c, &ts) == 0 ? (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec : -1;
}

// One reading: over the CPUs of this process's affinity set, the ticks spent busy (user, nice, system,
// irq, softirq, steal: a hypervisor's steal is a core nobody here gets) and in all; this process's CPU time.
struct aotc_cpu_ticks {
  int64_t busy = 0, all = 0, cpus = 0;
  int64_t own_ns = 0;
  bool ok = false;
};

// Sums /proc/stat's "cpuN ..." lines (``text``, ``n`` bytes) for the CPUs in ``set``.
static inline aotc_cpu_ticks aotc_cpu_ticks_parse(const char* text, int64_t n, const cpu_set_t& set) {
  aotc_cpu_ticks t;
  const char* end = text + n;
  for (const char* line = text; line < end;) {
    const char* next = line;
    while (next < end && *next != '\n') ++next;
    if (next - line > 4 && line[0] == 'c' && line[1] == 'p' && line[2] == 'u' && line[3] >= '0' && line[3] <= '9') {
      char* p = NULL;
      const long id = strtol(line + 3, &p, 10);
      if (id >= 0 && id < CPU_SETSIZE && CPU_ISSET((int)id, &set)) {
        int64_t f[8] = {};  // user nice system idle iowait irq softirq steal (guest time is within user)
        for (int i = 0; i < 8 && p < next; ++i) f[i] = strtoll(p, &p, 10);
        t.busy += f[0] + f[1] + f[2] + f[5] + f[6] + f[7];
        t.all += f[0] + f[1] + f[2] + f[3] + f[4] + f[5] + f[6] + f[7];
        t.cpus += 1;
      }
    }
    line = next + 1;
  }
  t.ok = t.cpus > 0;
  return t;
}

// Reads the counters now; ``ok`` is false where /proc/stat cannot be read (a sandbox without /proc).
static inline aotc_cpu_ticks aotc_cpu_ticks_now() {
  aotc_cpu_ticks t;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return t;
  const int fd = open("/proc/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return t;
  // The file is ~150 bytes a CPU; reads past the buffer are dropped (the per-CPU lines come first). One
  // buffer: the pool's policy runs on the calling thread, and the runtime serialises calls into a library.
  static char buf[1 << 16];
  int64_t n = 0;
  for (ssize_t r; n < (int64_t)sizeof buf && (r = read(fd, buf + n, sizeof buf - n)) > 0;) n += r;
  close(fd);
  t = aotc_cpu_ticks_parse(buf, n, set);
  t.own_ns = aotc_clock_ns(CLOCK_PROCESS_CPUTIME_ID);
  return t;
}

// Cores of the affinity set that neither other processes nor this process's calling thread used between
// two readings, on average: the set's cores, less the other processes' busy share, less one for the
// caller (0 at least). -1 when the window is too short to tell (under 2 ticks, ~20 ms) or a reading failed.
static inline double aotc_spare_cores(const aotc_cpu_ticks& a, const aotc_cpu_ticks& b) {
  if (!a.ok || !b.ok || a.cpus != b.cpus) return -1;
  const double window = (double)(b.all - a.all) / (double)b.cpus;  // ticks of one CPU
  if (window < 2) return -1;
  const double tick_ns = 1e9 / (double)sysconf(_SC_CLK_TCK);
  double others = ((double)(b.busy - a.busy) - (double)(b.own_ns - a.own_ns) / tick_ns) / window;  // in cores
  const double spare = (double)b.cpus - 1.0 - (others < 0 ? 0 : others);
  return spare < 0 ? 0 : spare;
}

#ifdef AOTC_SELFTEST_SPARE_CORES
#include <stdio.h>
#include <string.h>
// The parser on a fixed /proc/stat (CPUs 0-2, of which the set holds 0 and 2), the arithmetic on readings
// made up from it, and a real reading.
int main() {
  int fails = 0;
  const char* text =
      "cpu  900 0 300 5000 10 0 5 0 0 0\n"
      "cpu0 100 1 50 2000 4 0 2 3 7 0\n"
      "cpu1 500 0 200 1000 3 0 1 0 0 0\n"
      "cpu2 300 0 50 2000 3 0 2 0 0 0\n"
      "intr 12345 0 0\nctxt 999\ncpu9x\n";
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  CPU_SET(2, &set);
  const aotc_cpu_ticks t = aotc_cpu_ticks_parse(text, (int64_t)strlen(text), set);
  if (!t.ok || t.cpus != 2 || t.busy != 156 + 352 || t.all != 2160 + 2355)
    printf("parsed cpus %ld busy %ld all %ld\n", (long)t.cpus, (long)t.busy, (long)t.all), ++fails;
  const double tick_ns = 1e9 / (double)sysconf(_SC_CLK_TCK);
  aotc_cpu_ticks a = t, b = t;
  b.all += 2 * 10;  // 10 ticks of each CPU
  b.busy += 10 + 4;  // another process kept one core busy and this one used 4 ticks of the other
  b.own_ns += (int64_t)(4 * tick_ns);
  if (fabs(aotc_spare_cores(a, b)) > 1e-9) printf("spare %g, expected 0\n", aotc_spare_cores(a, b)), ++fails;
  b.busy -= 10;  // no other process
  if (fabs(aotc_spare_cores(a, b) - 1) > 1e-9) printf("spare %g, expected 1\n", aotc_spare_cores(a, b)), ++fails;
  b.all = a.all + 2;  // one tick: too short to tell
  if (aotc_spare_cores(a, b) != -1) printf("a 1-tick window gave %g\n", aotc_spare_cores(a, b)), ++fails;
  a.ok = false;
  if (aotc_spare_cores(a, b) != -1) printf("a failed reading gave %g\n", aotc_spare_cores(a, b)), ++fails;
  const aotc_cpu_ticks now = aotc_cpu_ticks_now();
  cpu_set_t mine;
  if (sched_getaffinity(0, sizeof mine, &mine) == 0 && (!now.ok || now.cpus != CPU_COUNT(&mine) || now.busy <= 0 || now.own_ns <= 0))
    printf("a reading of /proc/stat: ok %d, %ld cpus\n", (int)now.ok, (long)now.cpus), ++fails;
  return fails != 0;
}
#endif

#endif  // AOTC_SPARE_CORES_H
