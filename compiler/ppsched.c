/* scratch stand-in for ppsched.c (NOT committed): 1f1b and a naive order for others */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ppsched.h"
const char *const pp_schedule_names[PS_COUNT] = {"1f1b", "interleaved", "zb-h1", "zb-v"};
const char *const pp_act_names[3] = {"F", "B", "W"};
int pp_schedule_lookup(const char *n) { for (int i = 0; i < PS_COUNT; i++) if (!strcmp(n, pp_schedule_names[i])) return i; return -1; }
int pp_chunk_rank(const PpPlan *pl, int c) { if (pl->kind == PS_ZBV) return c < pl->p ? c : 2 * pl->p - 1 - c; return c % pl->p; }
int pp_chunk(const PpPlan *pl, int r, int v) { if (pl->kind == PS_ZBV) return v ? 2 * pl->p - 1 - r : r; return v * pl->p + r; }
int pp_chunk_vstage(const PpPlan *pl, int c) { if (pl->kind == PS_ZBV) return c >= pl->p; return c / pl->p; }
int ppsched_build(PpPlan *o, PpSchedule s, int p, int v, int m, char *err, size_t n) {
    if (!v) v = s == PS_ZBV ? 2 : s == PS_INTERLEAVED ? 2 : 1;
    o->kind = s, o->p = p, o->v = v, o->m = m;
    o->nact = calloc(p, sizeof(int)); o->act = calloc(p, sizeof(Action *));
    int zb = s == PS_ZBH1 || s == PS_ZBV;
    for (int r = 0; r < p; r++) {
        o->act[r] = calloc(3 * m * v, sizeof(Action));
        int k = 0;
        /* GPipe order by chunk: all F in chunk order, then all B in reverse chunk order */
        for (int vs = 0; vs < v; vs++) {
            int c = -1;
            /* chunks of this rank sorted ascending */
            int cs[8], nc = 0;
            for (int q = 0; q < v; q++) cs[nc++] = pp_chunk(o, r, q);
            for (int a = 0; a < nc; a++) for (int b = a + 1; b < nc; b++) if (cs[b] < cs[a]) { int t = cs[a]; cs[a] = cs[b]; cs[b] = t; }
            c = cs[vs];
            for (int mb = 0; mb < m; mb++) o->act[r][k++] = (Action){ACT_F, c, mb};
        }
        for (int vs = v - 1; vs >= 0; vs--) {
            int cs[8], nc = 0;
            for (int q = 0; q < v; q++) cs[nc++] = pp_chunk(o, r, q);
            for (int a = 0; a < nc; a++) for (int b = a + 1; b < nc; b++) if (cs[b] < cs[a]) { int t = cs[a]; cs[a] = cs[b]; cs[b] = t; }
            int c = cs[vs];
            for (int mb = 0; mb < m; mb++) { o->act[r][k++] = (Action){ACT_B, c, mb}; if (zb) o->act[r][k++] = (Action){ACT_W, c, mb}; }
        }
        o->nact[r] = k;
    }
    return 0;
}
void ppsched_free(PpPlan *pl) { for (int r = 0; r < pl->p; r++) free(pl->act[r]); free(pl->act); free(pl->nact); }
int ppsched_inflight_bound(const PpPlan *pl, int r) { return pl->m * pl->v; }
int ppsched_prove(const PpPlan *pl, char *err, size_t n) { return 0; }
int ppsched_simulate(const PpPlan *pl, const double *const cost[3], double latency, PpTimes *out) { return -1; }
void ppsched_times_free(PpTimes *t) {}
double ppsched_bubble_formula(PpSchedule s, int p, int v, int m, double tf, double tb, double tw) { return 0; }
