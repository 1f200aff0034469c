/* The what-if replay's level loop (meshprof/analyze/run/replay/replay.py: replay), in C: the same
 * integer arithmetic, member by member instead of one numpy call per level and array. Built on
 * first use by meshprof/analyze/run/replay/replay_native.py (plain C, no Python or numpy headers) and
 * called through ctypes; replay.py's numpy loop is the reference and the fallback.
 *
 * State: e_max, a_last and e_join, [k1][n_chains] row-major (k1 = scenarios + the spare row);
 * held, [k1][n_held]. Members [0, n) of this block, levels given by bounds (n_levels + 1
 * offsets into the block); within a level members are sorted by collective (a run of equal
 * coll is one collective) and a chain has at most one member. rows: n_rows arrays of n scenario
 * indices (in 1..k1-1; k1-1 is the spare row) whose member's gap changes by delta in that
 * scenario. join: -1 the completion joins at the chain's next member, -2 at none, else the
 * held slot it waits in; j_pos / j_slot (n_j, by position in this block): the held slots that
 * join at each member. Additions wrap as numpy's int64 does. */
#include <stdint.h>

static inline int64_t add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* scratch: 2 * k1 * (widest level) int64. */
void meshprof_replay_levels(int64_t n_levels, const int64_t* bounds, const int64_t* chain,
                            const int64_t* coll, const int64_t* gap, const int64_t* delta,
                            const int64_t* join, const uint8_t* waits, const int64_t* after,
                            const int64_t* cconst, int64_t n_rows, const int64_t* rows, int64_t n,
                            int64_t k1, int64_t n_chains, int64_t* e_max, int64_t* a_last,
                            int64_t* e_join, int64_t* held, int64_t n_held, const int64_t* j_pos,
                            const int64_t* j_slot, int64_t n_j, int64_t* scratch) {
  int64_t p = 0; /* next joiner */
  for (int64_t lvl = 0; lvl < n_levels; ++lvl) {
    const int64_t lo = bounds[lvl], hi = bounds[lvl + 1], w = hi - lo;
    if (w <= 0) continue;
    int64_t* arr = scratch;           /* [k1][w] */
    int64_t* done = scratch + k1 * w; /* [k1][w] */
    /* the completions held for this level's members join their chains */
    for (; p < n_j && j_pos[p] < hi; ++p) {
      const int64_t ch = chain[j_pos[p]], sl = j_slot[p];
      for (int64_t s = 0; s < k1; ++s) {
        int64_t* ej = e_join + s * n_chains + ch;
        *ej = max64(*ej, held[s * n_held + sl]);
      }
    }
    /* arrival: the later of the chain's last issue and its joined completions + the gap */
    for (int64_t s = 0; s < k1; ++s) {
      const int64_t* ej = e_join + s * n_chains;
      const int64_t* al = a_last + s * n_chains;
      for (int64_t j = 0; j < w; ++j) {
        const int64_t i = lo + j, ch = chain[i];
        arr[s * w + j] = add(max64(al[ch], ej[ch]), gap[i]);
      }
    }
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t* row = rows + r * n;
      for (int64_t j = 0; j < w; ++j) {
        const int64_t i = lo + j;
        arr[row[i] * w + j] = add(arr[row[i] * w + j], delta[i]);
      }
    }
    /* release of each collective: its last arrival (a member that does not wait: its
     * completion; at least the constant); completions */
    for (int64_t s = 0; s < k1; ++s) {
      const int64_t* a = arr + s * w;
      int64_t* d = done + s * w;
      int64_t j0 = 0;
      while (j0 < w) {
        int64_t j1 = j0 + 1;
        while (j1 < w && coll[lo + j1] == coll[lo + j0]) ++j1;
        int64_t rel = cconst[lo + j0];
        for (int64_t j = j0; j < j1; ++j) {
          const int64_t i = lo + j;
          rel = max64(rel, waits[i] ? a[j] : add(a[j], after[i]));
        }
        for (int64_t j = j0; j < j1; ++j) {
          const int64_t i = lo + j;
          d[j] = waits[i] ? add(rel, after[i]) : add(a[j], after[i]);
        }
        j0 = j1;
      }
    }
    /* the chains move on: last issue, latest completion, joined or held completion */
    for (int64_t s = 0; s < k1; ++s) {
      int64_t* em = e_max + s * n_chains;
      int64_t* al = a_last + s * n_chains;
      int64_t* ej = e_join + s * n_chains;
      const int64_t* a = arr + s * w;
      const int64_t* d = done + s * w;
      for (int64_t j = 0; j < w; ++j) {
        const int64_t i = lo + j, ch = chain[i], jn = join[i];
        al[ch] = a[j];
        em[ch] = max64(d[j], em[ch]);
        if (jn == -1)
          ej[ch] = max64(d[j], ej[ch]);
        else if (jn >= 0)
          held[s * n_held + jn] = d[j];
      }
    }
  }
}
