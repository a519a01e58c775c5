package gcra

import (
	"context"
	"time"
)

// Key names one GCRA state. Tag is the value that places the key in a Redis
// Cluster hash slot (keys sharing a Tag share a slot; composite checks need
// that); it may be empty. Name identifies the key within its tag. Stores
// accept any bytes in both; Name must not be empty and Tag plus Name must not
// exceed MaxKeyLen bytes.
type Key struct {
	Tag  string
	Name string
}

// Validate reports whether k is usable by a store.
func (k Key) Validate() error {
	switch {
	case k.Name == "":
		return ErrEmptyKey
	case len(k.Tag)+len(k.Name) > MaxKeyLen:
		return ErrKeyTooLong
	}
	return nil
}

// Check is one limit within a decision: the key, the schedule of limits it is
// decided under, and the cost.
type Check struct {
	Key      Key
	Schedule Schedule
	Cost     int64
}

// Store keeps GCRA state for many keys and decides against it on its own
// clock. Implementations are safe for concurrent use. Errors mean the store
// failed or the input was invalid (nothing is written then); a denial is a
// Result.
type Store interface {
	// Decide decides one request of the given cost (0 peeks).
	Decide(ctx context.Context, k Key, s Schedule, cost int64) (Result, error)
	// Reserve books the next slot if the wait is at most maxWait.
	Reserve(ctx context.Context, k Key, s Schedule, cost int64, maxWait time.Duration) (Result, error)
	// DecideAll decides several limits all or nothing, filling out (which
	// must have len(checks) elements) with each limit's result and returning
	// the combined one. The checks must name distinct keys.
	DecideAll(ctx context.Context, checks []Check, out []Result) (Result, error)
}

// ValidateMaxWait converts maxWait to whole microseconds (rounding down) and
// checks it is not negative.
func ValidateMaxWait(maxWait time.Duration) (int64, error) {
	if maxWait < 0 {
		return 0, ErrNegativeWait
	}
	return int64(maxWait / time.Microsecond), nil
}

// Binder is a Store that can bind a key once and then decide it without
// looking it up (gcra/memstore's interned handles). Callers that decide the
// same keys over and over — the simulator — use it when the store offers
// it; it decides exactly what Decide does.
type Binder interface {
	Bind(k Key) (Binding, error)
}

// Binding is one key bound in a store: Decide is Store.Decide on that key,
// on the store's clock. Safe for concurrent use.
type Binding interface {
	Decide(ctx context.Context, s *Schedule, cost int64) (Result, error)
}
