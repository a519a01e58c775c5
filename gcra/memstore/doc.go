// Package memstore is a concurrent in-memory gcra.Store: the embedded
// default of a single agent and the store the simulator decides through.
//
// # Model
//
// The store keeps each key's state as the same bytes Redis keeps for it —
// its gcra.Value (the exact TAT and epoch tag), with Rested beside it as
// Redis keeps the key's expiry — and decides every request with
// gcra.Decide, gcra.Reserve or gcra.DecideAll on the state decoded from
// them; it holds no GCRA arithmetic of its own. So the simulator, which
// decides through this store, runs the representation production stores. It writes the state those functions return only when they say to,
// so a peek (cost 0) or bad input never changes a key, and a denial
// changes only how a converted state is stored, never its tokens
// (gcra.Rebase). Bad input —
// a negative cost or maxWait, an invalid schedule, an invalid key or handle —
// is an error; a denial is a gcra.Result.
//
// Time is an int64 count of microseconds. The gcra.Store methods (Decide,
// Reserve, DecideAll) read Config.Clock; the hot-path methods (DecideAt,
// ReserveAt, DecideAllAt) take now from the caller, as the simulator's
// virtual clock does. Use one timeline per store: automatic sweeps run at the
// latest now a shard has seen. A now earlier than a key's last decision is
// decided conservatively by GCRA (the key looks less rested), except that a
// key already evicted at a later now is forgotten.
//
// # Handles
//
// Intern validates a key once and returns a Handle, a pointer-sized value
// that reaches the key's state without hashing it. The *At methods take
// handles and allocate nothing once the key exists. A handle stays valid for
// the life of its Store: when its key is evicted, the next call through the
// handle re-finds the key's live entry, or re-creates it as rested (which can
// fail with ErrFull when the store is full). If another path re-created the
// key first, each call through the old handle costs one map lookup; Intern
// again to get the direct path back. A handle is bound to the Store that
// made it; the zero Handle and a handle from another Store are errors.
//
// # Eviction
//
// A key is dropped once its state's Rested time has passed (gcra.State):
// from then on it holds its full burst under every limit its schedule named
// when it was written, including a change still pending then, so a missing
// key decides no more generously than the state would have — exactly under
// a steady limit, conservatively (the previous limit's burst, clamped) just
// after a change. The one residue is a change the writer did not yet know
// of; see the gcra package documentation.
//
// Eviction is amortized and inline; the store runs no goroutine. A shard
// sweeps itself, at the latest now it has seen, whenever its map has grown to
// max(1024, 2 × its size after its previous sweep), and after a sweep that
// removed most of its keys it copies the survivors into a new, smaller map so
// the memory is returned. Sweep sweeps every shard at an explicit now. Keys
// that were interned or decided but never written hold no state and are
// swept at any now. Config.MaxKeys caps the number of keys: each shard holds
// at most MaxKeys/Shards; creating a key in a full shard sweeps it first and,
// if it is still full, fails with ErrFull and decides nothing — the caller's
// failure policy decides.
//
// # Concurrency
//
// A Store is safe for concurrent use by many goroutines. Keys are hashed
// (hash/maphash, with a seed per store) onto Config.Shards shards, each with
// its own mutex and map, so decisions on keys in different shards never
// contend. A composite decision locks the distinct shards it touches in
// ascending order, so composites cannot deadlock one another, and decides
// all of its keys while holding them: it admits on every key or none.
package memstore
