// Package gcra is the generic cell rate algorithm as Meridian uses it: pure
// functions of an explicit now, with no clock, no I/O and no dependencies
// beyond the standard library. The stores (gcra/memstore, gcra/redisstore)
// and the simulator all decide through it.
//
// # Model
//
// A Limit admits one event every T microseconds (the emission interval,
// Period/Rate rounded up to whole µs) with Burst events back to back after
// idle. A key's state is its theoretical arrival time (TAT) in µs. A request
// of cost n at now is admitted iff newTAT − now ≤ Burst·T, where
// newTAT = max(TAT, now) + n·T; then TAT becomes newTAT. A denial never moves
// the TAT, and its RetryAfter is exact: newTAT − Burst·T − now. (A denial
// of a state read through a limit change may store it again in the unit
// of the limit in force, holding the same tokens: see Rebase.) A cost above
// Burst can never be admitted and is reported as Result.TooLarge with
// RetryAfter Never; n is compared with Burst before any multiplication, so no
// cost overflows. Cost 0 peeks and writes nothing. Remaining is
// floor((Burst·T − (TAT − now))/T) clamped to [0, Burst], exact (no
// off-by-one). The zero Limit denies everything and writes nothing.
//
// Reserve books the next slot instead of refusing an early request, when the
// wait is at most maxWait. DecideAll checks several limits all or nothing.
//
// # Limit changes keep tokens
//
// A region's limit for a key changes whenever the coordinator changes its
// share. The caller passes a Schedule: the limit in force with its epoch and
// effective time, and the limit it replaced. The store chooses between them
// by its own clock, so all agents of a region switch a key at the same
// instant, and converts the stored state lazily, at the key's next request,
// evaluating the conversion at the effective time: the key keeps the tokens
// it had then, clamped to the new burst (an increase adds capacity and
// refill rate, never tokens). Booked reservations stay booked as debt, and
// the debt keeps at least its length in time: the booked requests are
// served at the slots they were given, so new bookings under a faster limit
// start after the last of them, also through a zero limit (which holds no
// tokens but keeps the slots booked past the change: a state older than a
// zero previous limit is a sibling agent's, written under the same
// version's other epoch slot while this agent ran the key reduced). State
// older than the previous change
// counts as empty at that change — or as its stored TAT if that is later,
// so that slots it booked are not forgotten — and refills at the previous
// limit's rate; so does a key with no state (a version in force since time
// 0, Steady's or a cold key's, has always been in force: a key with no
// state is full under it). A key with no state used to hold the previous
// limit's full burst at the change — wrong when the previous limit had
// itself replaced a smaller one less than a window before (the zero limit,
// a floor): a region handed a unit of burst by one table and a rate by the
// next then held a token the budget had spent in another region (issue 18;
// the simulator's explorer found OA_budget 0.7 % of a key with no fault at
// all). Releases before this one still read it so. State written under a newer epoch than the
// caller knows keeps its tag and is never converted back to an older
// epoch: it is used as stored, only taken into the caller's unit when its
// writer's limit differs (see Stored state). Conversions round credit down and debt up, so the available tokens
// of a key never rise at a transition. A conversion that would carry a
// key's debt beyond MaxTAT (booked reservations converted to a limit
// slower by many orders of magnitude) saturates there, where the key is
// blocked for longer than any window lasts.
//
// # Dropping rested keys
//
// A store may drop a key once its state's Rested time has passed (Redis
// expires it, memstore sweeps it): from then on a missing key holds what
// the state would. Rested is the later of the TAT and one window past the
// change to the version it was written under (a missing key counts as
// empty at that change); and when the write happened under the previous
// limit of a change still pending and the key will still be refilling at
// the change, also the converted TAT, so a key short of tokens at a rate
// cut cannot expire and come back with the previous limit's full burst.
// What this cannot cover is a change the writer did not know of yet: a key
// written before its region learned of a change, still refilling at the
// change, and not touched again before it expires, comes back holding what
// a key with no state holds there, up to min(previous burst, new burst) —
// at most one burst per key per change. Announcing each change at
// least one previous window (Burst·T) before its effective time removes it.
//
// # Stored state
//
// Nothing is rewritten in bulk when shares change, and a key costs one
// small value: its Value, the exact TAT, the low TagBits (40) bits of the
// epoch it was written under (EpochTag) and the limit it was written under
// (State.T, State.Burst), 24 bytes that every store keeps as they are —
// Redis as the key's string, gcra/memstore in its entry (see EncodeValue).
// What a store keeps is therefore read back exactly under any later
// schedule: however long the key lives, however many versions its limit
// has moved on, with a TAT far behind now, and whichever limit wrote it.
// A TAT counts tokens in its writer's unit (T): read in another limit's
// unit, a fast writer's spent window is a slow reader's credit. So a state
// written under another limit than the one the reader's schedule gives its
// epoch — a sibling agent of the region in another epoch slot (one whose
// lease lapsed, one restarted cold, one a false suspicion left unnamed),
// a version the reader skipped, or the same epoch at another reduced
// limit — is converted from its writer's limit: to the tokens it holds at
// c = max(the reader's version's effective time, min(now, its TAT)),
// clamped to the reader's burst, refilling at the reader's rate from c
// (any c in that range counts every admission and refills only while the
// reader's limit was in force; the latest keeps a state written long after
// the change from reading its rested time as debt). Since c moves with the
// read, such a state would refill at its writer's rate until its TAT passed
// — a region raised from a floor whose one admission put the TAT minutes
// ahead denied for those minutes — so the first denial that reads it
// stores it again in the reader's unit, holding the tokens it holds then
// (Rebase), and it refills at the reader's rate from there. A state older than the
// reader's previous change is also floored at "empty at that change", as
// above. The 12-byte value of the release before (EncodeValueV2, no
// writer's limit) and the packed integer of earlier ones (PackV1, which
// kept the TAT only modulo 2^37 and had to guess the rest from the
// schedule) are still read (DecodeValue, UnpackV1) — as those releases
// read them, in the reader's unit — so that their keys and agents survive
// an upgrade.
//
// Tags compare by serial-number arithmetic: a Schedule's current epoch tag
// must be 1 to 2^39 − 1 ahead of its previous one (Validate refuses
// anything else), and no key's state may live while its epochs advance by
// 2^39 or more. The natural epoch is therefore a per-key change counter —
// the number of times that key's limit has changed
// (rebalance.KeyShares.Version) — which moves by a few per change: even at
// a change every millisecond it takes years to move 2^39.
//
// # Bounds
//
// Every instant — now, effective times — lies in [0, MaxTime) (2^52 µs,
// about 142 years from the clock's zero); a limit's window Burst·T, and
// Burst·T + maxWait for a reservation, is at most MaxWindow (2^51 µs, about
// 71 years), and its Burst at most MaxBurst (2^39 − 1); every TAT is at most
// MaxTAT = MaxTime + MaxWindow − 1. So every value the Redis script
// computes stays an exact integer below 2^53 in its Lua doubles. A yearly
// quota fits; what the window bounds is a tiny share of a slow limit (see
// rebalance.MinShare).
//
// # Errors
//
// Bad input — a negative cost or maxWait, an invalid limit, an empty or
// oversized key — is an error and changes nothing. A denial is never an
// error.
//
// # Concurrency
//
// Everything here is a pure function of its arguments or an immutable
// value; all of it is safe for concurrent use.
package gcra
