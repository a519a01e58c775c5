package rebalance_test

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/rebalance"
)

// brief formats grants to two decimals, dropping trailing zeros.
func brief(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.FormatFloat(math.Round(x*100)/100, 'f', -1, 64)
	}
	return "{" + strings.Join(s, ", ") + "}"
}

// Doorman's published example: capacity 120, three clients wanting 1000,
// 50 and 10. The client wanting 10 gets it; under PROPORTIONAL_SHARE the
// capacity it leaves below the equal share of 40 goes to the others in
// proportion to how far they want beyond 40.
func ExampleDoormanProportional() {
	fmt.Println(brief(rebalance.DoormanProportional(120, []float64{1000, 50, 10})))
	// Output: {69.69, 40.31, 10}
}

// The same input under FAIR_SHARE: the 30 left below the equal share is
// split equally between the two larger clients (15 each); the one wanting
// 50 needs only 10 of it, and the second round gives its 5 to the largest.
func ExampleDoormanFair() {
	fmt.Println(brief(rebalance.DoormanFair(120, []float64{1000, 50, 10})))
	// Output: {60, 50, 10}
}

// Water-filling the same input: the level rises to 60, where only the
// largest client is still short.
func ExampleMaxMin() {
	fmt.Println(brief(rebalance.MaxMin(120, []float64{1000, 50, 10})))
	// Output: {60, 50, 10}
}

// Doorman's example through the strategies, as shares of a budget of 120
// per second (T rounds up to 8334 µs, so a demand of d per second is d·8334
// ppm) with floors of 1 % for each region; then each region's limit under
// maxmin: 499960 ppm of 120/s is 60/s, as water-filling gave above.
func ExampleNewStrategy() {
	regions := []string{"ap", "eu", "us"}
	in := rebalance.Input{
		Budget: gcra.PerSecond(120, 12),
		Demand: []float64{1000, 50, 10}, // offered per second
		Safe:   []uint32{10000, 10000, 10000},
	}
	var p rebalance.Params // maxmin without headroom
	for _, name := range []string{"proportional", "doorman-proportional", "doorman-fair", "maxmin"} {
		s, err := rebalance.NewStrategy(name, regions, p)
		if err != nil {
			panic(err)
		}
		shares := make([]uint32, len(regions))
		s.Allocate(&in, shares)
		fmt.Printf("%-20s %v\n", name, shares)
	}

	s, _ := rebalance.NewStrategy("maxmin", regions, p)
	shares := make([]uint32, len(regions))
	s.Allocate(&in, shares)
	limits := make([]gcra.Limit, len(regions))
	rebalance.Derive(in.Budget, shares, nil, []bool{true, true, true}, limits, make([]float64, 3), make([]int64, 3))
	for i, l := range limits {
		fmt.Printf("%s %v\n", regions[i], l)
	}
	// Output:
	// proportional         [925094 55755 19151]
	// doorman-proportional [570562 336098 93340]
	// doorman-fair         [479960 426700 93340]
	// maxmin               [499960 416700 83340]
	// ap T=16670µs burst 6
	// eu T=20000µs burst 5
	// us T=100000µs burst 1
}
