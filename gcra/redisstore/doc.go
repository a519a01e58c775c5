// Package redisstore is a gcra.Store on Redis: a single node, Sentinel or a
// Cluster, through a go-redis v9 UniversalClient (not a Ring, which shards
// on the client).
//
// # Decisions
//
// One embedded Lua script (gcra.lua) is the Redis twin of gcra.Decide,
// gcra.Reserve and gcra.DecideAll; a randomized conformance test holds the
// two to identical results and written state. The script takes the time
// from the server's TIME, so every agent of a region shares one clock, and
// it is run by EVALSHA (go-redis re-sends it with EVAL on NOSCRIPT). Every
// number it computes or stores is an integer below 2^53 (the products of
// a conversion are split into 26-bit limbs), and no number is ever
// formatted by Lua's tostring (which would use exponent notation).
//
// A script call carries its batch compactly: KEYS are the batch's keys in
// order, ARGV[1] is empty (tests pass an explicit now in µs), and ARGV[2] is
// one string of big-endian signed 64-bit integers (8 bytes each, written
// with encoding/binary and read by the script with struct.unpack '>i8'): the
// number of ops, the distinct schedules, then one word per decision (see
// gcra.lua for the layout); ARGV[3] names the write format (empty for the
// Value, "1" for the packed integer; see below). The reply is one string in
// the same encoding (struct.pack '>i8'): four integers per check, five for
// a reservation. So go-redis boxes three arguments per call instead of one
// per number, and the
// reply is one string instead of an array of boxed integers. A batch that
// is not whole 8-byte integers is refused by the script before it reads or
// writes anything; a reply of the wrong type or length, or with a value
// outside [-1, 2^53), is an error wrapping ErrReply, never a panic, and so
// is any value the decoding of a check does not expect.
//
// # Keys and memory
//
// A key is Prefix + "{" + base64url(Tag) + "}" + Name (see Store.RedisKey):
// the Cluster hash tag is an injective, brace-free encoding of the caller's
// tag, so no tenant id can move a key to another slot or make two keys
// collide. Its value is the key's gcra.Value — 24 bytes: the exact TAT,
// the 40-bit epoch tag and the limit it was written under — which Redis
// keeps in the key's object (encoding embstr), and it expires (PX) at
// gcra.State.Rested. The value reads back exactly under any later
// schedule, also under a limit other than its writer's (a sibling agent's
// epoch slot, a skipped version): the script converts it from the
// writer's limit. A key costs 32 bytes more than a bare `SET key <int> PX
// ttl` of the same key: 186 B against 154 B per 38-byte key on Redis 7.0
// (TestMemoryPerKey; the 12-byte value of the release before cost 16). A
// key that holds anything the script did not write fails its own decision
// with ErrMalformedState and is left alone.
//
// A composite decision is one script call. On a Cluster (a
// *redis.ClusterClient) that call runs on one node, so all its keys must
// hash to one slot (one non-empty Tag), and it fails with ErrCrossSlot
// otherwise, before anything is sent; a caller that knows it is on a Cluster
// refuses such composites itself (region.Config.OneSlot, and
// Policy.CheckOneSlot at load). A single node or Sentinel has no slots: a
// composite of any keys, tagged or not, is decided there in one call,
// atomically.
//
// # Region fence
//
// Store is a gcra.Fencer on a single node or Sentinel: one more key,
// Prefix + "meridian-fence" (no '{', so no key of RedisKey's form can be
// it), holds the (term, epoch) of the newest share table an agent of the
// region has applied. RaiseFence only raises it, reads it back, waits for
// every connected replica to have the write (WAIT, at most
// Config.FenceWait, 1 s by default) and
// returns the server's identity (run_id and prefix hashed: a restart or a
// failover changes it). A batch with fenced checks reads the key once and
// answers a fenced check below it — or any fenced check while the key is
// missing — with gcra.ErrFenced, writing nothing (a composite's other
// checks neither). A Cluster keeps no fence: RaiseFence returns identity 0
// and fenced checks are decided as unfenced ones.
//
// # Upgrading from the packed format
//
// Releases before the Value stored one integer, gcra.PackV1's
// (TAT mod 2^37)·2^16 + (tag mod 2^16), and read it back relative to a
// guess of where the TAT lay, which failed for a state that outlived the
// schedule that wrote it (a daily key was blocked for 13 hours). The script
// still reads that integer, below the key's expiry (gcra.UnpackV1): the
// expiry is the key's Rested, never before its TAT, so the TAT comes back
// exactly. Agents of those releases cannot read a Value: they fail the
// decision as malformed state and their limit's failure mode decides. So a
// rolling upgrade runs in two steps: first every agent moves to this release
// with Config.WriteFormat = FormatPacked (agent config redis.write_format:
// packed), which writes the old integer and keeps the old releases' 36 h
// bound on windows (a longer window decides as the zero limit, as it did
// there); then, once no older agent is left, WriteFormat goes back to
// FormatValue. TestRollingUpgrade runs the older release's script beside
// this one on one server and finds no over-admission in either step.
//
// # Upgrading from the 12-byte value
//
// The release before this one stored a 12-byte value (the exact TAT and
// tag, gcra.EncodeValueV2) without the limit it was written under, and
// read every state in the unit of the limit its own schedule gave the
// state's epoch: a sibling agent's state written under another limit — in
// another epoch slot, or a version the reader skipped — turned a fast
// writer's admissions into a slow reader's credit. This release reads the
// 12-byte value exactly as that release did, and its agents fail a
// decision on the 24-byte Value as malformed state. So the upgrade runs in
// two steps again: every agent moves to this release with WriteFormat =
// FormatValue12 (redis.write_format: value12), then back to FormatValue
// once no agent of that release is left. Until then the old reading, and
// its over-admission under faults, stays. TestRollingUpgradeFromValue12
// runs that release's script beside this one: each decides exactly as the
// pure core on the bytes stored.
//
// # Batching
//
// Concurrent callers are coalesced into one script call per batch: a
// decision goes to the lane of its first key's hash slot (on a Cluster, one
// lane per slot, so a batch never crosses slots; on a single node or
// Sentinel, Config.Lanes lanes by slot), and each lane has at most one call
// in flight and runs its decisions in the order they queued, each
// atomically. So a key's single decisions keep their order; on a single node
// a composite whose keys map to different lanes runs in its first key's
// lane, ordered with that key's decisions but not with the others' queued
// at the same time (each decision is still atomic, and one answered before
// another is submitted always ran first; with one lane, the agent's
// default, everything keeps its order). A caller
// that finds its lane idle sends its decision at once, on its own goroutine:
// a lone caller pays nothing for batching. Callers that arrive while a call
// is in flight queue, and the lane's runner goroutine sends them together,
// up to Config.MaxBatch checks per call (the runner parks between queues and
// ends after 50 ms without one, so an idle Store holds no goroutines); after
// each batch of more than one op it
// waits up to 20 µs for the callers it just answered to queue again, so that closed-loop
// callers do not phase-lock into alternating one-op and many-op calls. Each
// distinct schedule is sent once per call. About Config.MaxInFlight
// decisions are outstanding at most; more callers wait, or give up when their
// context ends. A caller whose context ends while queued is dropped from
// the queue (nothing is decided); one whose call is already on the wire gets
// its context's error, and the decision may still have been made (a
// consumed token the caller never used only under-admits).
//
// # Errors and time-outs
//
// Bad input is an error wrapping ErrBadInput (and the gcra error that
// explains it) before anything is sent. Each call carries the store's
// Timeout unless the caller's context ends sooner; the go-redis client must
// set ContextTimeoutEnabled for a deadline to cut a blocked read short. An
// error is never a denial: what to do when Redis fails is the caller's
// failure policy. ErrCrossSlot, ErrBadInput and ErrMalformedState are about
// the call or one key, with Redis healthy, and say so (a method
// StoreHealthy() bool returning true), so that a circuit breaker does not
// count them as Redis failing; time-outs, connection errors, Redis error
// replies and ErrReply do count. Those come as a *RoundTripError naming
// the script call that failed, the same for every decision batched into it
// or queued behind it (a queued caller whose context ends gets its
// context's error in one), so a breaker can count failed round trips
// rather than the decisions they happened to carry.
//
// # Tests
//
// Store has an unexported way to pass now to the script instead of TIME, so
// the same vectors run through Go and Lua. Tests that need Redis use the one
// at 127.0.0.1:6379 (or MERIDIAN_REDIS_ADDR); those that flush, measure
// memory or need a Cluster start their own redis-server processes.
package redisstore
