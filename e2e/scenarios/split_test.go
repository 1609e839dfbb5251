package scenarios

import (
	"math"
	"testing"
)

// binomialBounds returns the acceptance interval [lo, hi] of a two-sided test of a count X
// distributed Binomial(n, p), each tail holding at most alpha/2: lo is the largest k with
// P(X < k) <= alpha/2 and hi the smallest k with P(X > k) <= alpha/2. tail is
// P(X < lo) + P(X > hi) (at most alpha): the chance that a count from exactly that distribution
// falls outside. It needs 0 < p < 1 and n >= 0. The probabilities are summed from the exact
// probability mass function (log-gamma, so n in the thousands does not overflow).
func binomialBounds(n int, p, alpha float64) (lo, hi int, tail float64) {
	lgf := func(k int) float64 { v, _ := math.Lgamma(float64(k) + 1); return v }
	pmf := func(k int) float64 {
		return math.Exp(lgf(n) - lgf(k) - lgf(n-k) + float64(k)*math.Log(p) + float64(n-k)*math.Log1p(-p))
	}
	below := 0.0 // P(X < lo)
	for lo = 0; lo < n && below+pmf(lo) <= alpha/2; lo++ {
		below += pmf(lo)
	}
	above := 0.0 // P(X > hi)
	for hi = n; hi > 0 && above+pmf(hi) <= alpha/2; hi-- {
		above += pmf(hi)
	}
	return lo, hi, below + above
}

// binomialProb returns P(lo <= X <= hi) for X distributed Binomial(n, p).
func binomialProb(n int, p float64, lo, hi int) float64 {
	lgf := func(k int) float64 { v, _ := math.Lgamma(float64(k) + 1); return v }
	sum := 0.0
	for k := max(lo, 0); k <= min(hi, n); k++ {
		sum += math.Exp(lgf(n) - lgf(k) - lgf(n-k) + float64(k)*math.Log(p) + float64(n-k)*math.Log1p(-p))
	}
	return sum
}

func TestBinomialBounds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		p      float64
		alpha  float64
		lo, hi int
	}{
		// pmf of Binomial(4, 1/2): 1/16, 4/16, 6/16, 4/16, 1/16.
		{"fair coin, 4 flips, 20%", 4, 0.5, 0.2, 1, 3},
		{"fair coin, 4 flips, 10%: no tail small enough", 4, 0.5, 0.1, 0, 4},
		{"fair coin, 4 flips, 13%: exactly one tail each", 4, 0.5, 0.125, 1, 3},
		// P(X = 0) = 0.9^10 = 0.349: the lower tail cannot be cut at 5%; P(X > 3) = 0.0128,
		// P(X > 2) = 0.0702.
		{"rare event, small n", 10, 0.1, 0.05, 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi, tail := binomialBounds(tc.n, tc.p, tc.alpha)
			if lo != tc.lo || hi != tc.hi || tail > tc.alpha {
				t.Errorf("binomialBounds(%d, %v, %v) = [%d, %d] tail %v; want [%d, %d], tail <= alpha", tc.n, tc.p, tc.alpha, lo, hi, tail, tc.lo, tc.hi)
			}
		})
	}
	// The canary scenario's numbers: each bound is the last one that keeps its tail under
	// alpha/2 (one step further out would not), and the total is the complement of the interval.
	n, p, alpha := 1000, 0.1, 1e-6
	lo, hi, tail := binomialBounds(n, p, alpha)
	if below := binomialProb(n, p, 0, lo-1); below > alpha/2 || binomialProb(n, p, 0, lo) <= alpha/2 {
		t.Errorf("lo %d: P(X < lo) = %g, P(X <= lo) = %g; want the first <= %g < the second", lo, below, binomialProb(n, p, 0, lo), alpha/2)
	}
	if above := binomialProb(n, p, hi+1, n); above > alpha/2 || binomialProb(n, p, hi, n) <= alpha/2 {
		t.Errorf("hi %d: P(X > hi) = %g, P(X >= hi) = %g; want the first <= %g < the second", hi, above, binomialProb(n, p, hi, n), alpha/2)
	}
	if inside := binomialProb(n, p, lo, hi); math.Abs(1-inside-tail) > 1e-9 {
		t.Errorf("tail %g, but P(lo <= X <= hi) = %g", tail, inside)
	}
	// Power: without the route the split is 50/50 and never lands in the interval.
	if miss := binomialProb(n, 0.5, lo, hi); miss > 1e-100 {
		t.Errorf("P(a 50/50 split lands in [%d, %d]) = %g", lo, hi, miss)
	}
	t.Logf("Binomial(%d, %v) at alpha %g: [%d, %d], false-failure chance %.3g", n, p, alpha, lo, hi, tail)
}
