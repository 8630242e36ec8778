// LD_PRELOAD for test_sqlite_plans.py: counts the runs of each prepared SQLite statement (Keel
// resets a cached statement after each run) and, at exit, writes one record per statement to
// the file $KEEL_SQL_COUNTS: the count, a tab, the SQL text, and the record separator 0x1e.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sqlite3_stmt sqlite3_stmt;

enum { kSlots = 8192 };
static const void* stmts[kSlots];
static long counts[kSlots];
static char* texts[kSlots];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

int sqlite3_reset(sqlite3_stmt* s) {
  static int (*real_reset)(sqlite3_stmt*);
  static const char* (*real_sql)(sqlite3_stmt*);
  if (!real_reset) {
    real_reset = (int (*)(sqlite3_stmt*))dlsym(RTLD_NEXT, "sqlite3_reset");
    real_sql = (const char* (*)(sqlite3_stmt*))dlsym(RTLD_NEXT, "sqlite3_sql");
  }
  pthread_mutex_lock(&mu);
  unsigned long h = ((unsigned long)s >> 4) % kSlots;
  for (int probes = 0; probes < kSlots && stmts[h] && stmts[h] != s; ++probes) h = (h + 1) % kSlots;
  if (!stmts[h]) {
    const char* sql = real_sql(s);
    stmts[h] = s;
    texts[h] = strdup(sql ? sql : "");
  }
  if (stmts[h] == s) ++counts[h];
  pthread_mutex_unlock(&mu);
  return real_reset(s);
}

__attribute__((destructor)) static void write_counts(void) {
  const char* path = getenv("KEEL_SQL_COUNTS");
  if (!path) return;
  FILE* f = fopen(path, "w");
  if (!f) return;
  for (int i = 0; i < kSlots; ++i) {
    if (stmts[i]) fprintf(f, "%ld\t%s\x1e", counts[i], texts[i]);
  }
  fclose(f);
}
