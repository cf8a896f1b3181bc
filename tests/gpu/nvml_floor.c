/* What NVML itself costs, without the agent: resident memory after each step of what the agent
 * does, and the CPU time of nvmlGpmMetricsGet by number of metrics asked for. Built and run by
 * tests/gpu/overhead.sh (gcc, no NVML headers needed: the few declarations are below). */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef void *dev_t_;
typedef void *sample_t;
typedef struct { unsigned id; int ret; double value; char *s, *l, *u; } metric_t;
typedef struct { unsigned version, n; sample_t s1, s2; metric_t m[210]; } metrics_get_t;

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256]; long v = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld", &v) == 1) break;
  if (f) fclose(f);
  return v;
}
static double cpu_ms(void) {
  struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
#define SYM(name) name##_f = (typeof(name##_f))dlsym(h, #name); if (!name##_f) { printf("no %s\n", #name); return 1; }

int main(void) {
  printf("start                         rss %6ld KiB\n", rss_kib());
  void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
  printf("libnvidia-ml loaded           rss %6ld KiB\n", rss_kib());
  int (*nvmlInit_v2_f)(void); SYM(nvmlInit_v2);
  int (*nvmlDeviceGetHandleByIndex_v2_f)(unsigned, dev_t_ *); SYM(nvmlDeviceGetHandleByIndex_v2);
  int (*nvmlDeviceGetPowerUsage_f)(dev_t_, unsigned *); SYM(nvmlDeviceGetPowerUsage);
  int (*nvmlDeviceGetTotalEnergyConsumption_f)(dev_t_, unsigned long long *); SYM(nvmlDeviceGetTotalEnergyConsumption);
  int (*nvmlGpmSampleAlloc_f)(sample_t *); SYM(nvmlGpmSampleAlloc);
  int (*nvmlGpmSampleGet_f)(dev_t_, sample_t); SYM(nvmlGpmSampleGet);
  int (*nvmlGpmMetricsGet_f)(metrics_get_t *); SYM(nvmlGpmMetricsGet);
  if (nvmlInit_v2_f()) { printf("nvmlInit failed\n"); return 1; }
  printf("nvmlInit                      rss %6ld KiB\n", rss_kib());
  dev_t_ d; nvmlDeviceGetHandleByIndex_v2_f(0, &d);
  unsigned p; nvmlDeviceGetPowerUsage_f(d, &p);
  printf("handle + power                rss %6ld KiB\n", rss_kib());
  unsigned long long e; nvmlDeviceGetTotalEnergyConsumption_f(d, &e);
  printf("energy                        rss %6ld KiB\n", rss_kib());
  sample_t a, b; nvmlGpmSampleAlloc_f(&a); nvmlGpmSampleAlloc_f(&b);
  nvmlGpmSampleGet_f(d, a); usleep(200000); nvmlGpmSampleGet_f(d, b);
  printf("two gpm samples               rss %6ld KiB\n", rss_kib());
  static const unsigned ids[] = {2, 3, 5, 10, 11, 12, 13, 60, 61, 20, 21};
  static metrics_get_t g;
  for (unsigned n = 1; n <= 11; n++) {
    if (n != 1 && n != 2 && n != 4 && n != 7 && n != 9 && n != 11) continue;
    double best = 1e9, sum = 0; int reps = 30, rc = 0;
    for (int r = 0; r < reps; r++) {
      memset(&g, 0, sizeof g); g.version = 1; g.n = n; g.s1 = a; g.s2 = b;
      for (unsigned i = 0; i < n; i++) g.m[i].id = ids[i];
      double t0 = cpu_ms(); rc = nvmlGpmMetricsGet_f(&g); double t = cpu_ms() - t0;
      sum += t; if (t < best) best = t;
    }
    printf("gpm metrics get, %2u metrics   cpu %.3f ms mean, %.3f ms best (rc %d, first value %.2f)\n", n, sum / reps, best, rc, g.m[0].value);
  }
  /* one metric at a time: which are costly */
  for (unsigned i = 0; i < 11; i++) {
    double sum = 0;
    for (int r = 0; r < 20; r++) {
      memset(&g, 0, sizeof g); g.version = 1; g.n = 1; g.s1 = a; g.s2 = b; g.m[0].id = ids[i];
      double t0 = cpu_ms(); nvmlGpmMetricsGet_f(&g); sum += cpu_ms() - t0;
    }
    printf("  metric %2u alone             cpu %.3f ms (value %.2f, rc %d)\n", ids[i], sum / 20, g.m[0].value, g.m[0].ret);
  }
  double t0 = cpu_ms();
  for (int r = 0; r < 20; r++) nvmlGpmSampleGet_f(d, b);
  printf("gpm sample get                cpu %.3f ms\n", (cpu_ms() - t0) / 20);
  printf("after gpm metrics             rss %6ld KiB\n", rss_kib());
  FILE *f = fopen("/proc/self/status", "r"); char line[256];
  while (f && fgets(line, sizeof line, f)) if (!strncmp(line, "VmHWM", 5) || !strncmp(line, "Threads", 7)) fputs(line, stdout);
  return 0;
}
