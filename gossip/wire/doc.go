// Package wire is the versioned wire format of Meridian's control traffic:
// agents' demand reports and acknowledgements, and the coordinator's
// signed share tables. It is a pure codec — bytes in, values out — with
// no I/O, no clock and no goroutines; the gossip package sends what it
// encodes over NATS, and the simulator counts control bytes with the same
// size functions, so the cost it reports is the cost production pays.
//
// # Model
//
// A report (rebalance.Report, with the agent's send time for skew
// estimates) or a table (rebalance.Table) is split into chunks, each one
// message of at most maxMessage bytes (DefaultMaxMessage, half of NATS's
// default max_payload). Every report chunk repeats the report's fields and
// carries a run of its keys; chunk 0 of a table carries its header (every
// field but Keys), and every chunk a run of its rows. An Ack is always one
// message. Decode reads one message; an Assembler joins the chunks of a
// report (by region, agent and interval) or a table (by term and epoch),
// in any order, into the whole value.
//
// A delta table (EncodeTableFrom) is one the coordinator encodes from a
// base, the table before it: chunk 0 then carries the header and a Delta —
// the base's (term, epoch), the rows that changed or were added, the keys
// removed (explicit tombstones), and the SHA-256 digest of the whole
// table's rows — and no rows, and chunks 1..n carry every row as before.
// A reader that holds the base builds the whole table from chunk 0 with
// Patch, which checks the digest, so a steady cluster moves one small
// message per region per table instead of the whole table; a reader on
// another base (ErrBase), a new reader, or one of an earlier minor version
// (which skips the field) reads the chunks. The coordinator writes a delta
// only when its head is smaller than the whole table; a table's KV entry
// (the head) therefore always leads to a whole table.
//
// A delta names a changed row either whole (Delta.Changed) or, when every
// reader reads them (FeatureRowPatches) and the row keeps its key and
// budget, as a row patch (Delta.Patched): its place among the base's rows,
// its version step, shares and bursts — no key, no budget. A share move of
// a three-region row then costs about 20 bytes instead of 60 (measured:
// TestRowPatchSmall, 7,042 against 17,610 bytes for 334 moved rows). A
// reader that skips the patches fails the digest and reads the chunks; a
// coordinator writes them only once every agent its table names has
// reported the feature.
//
// Tables are signed: each chunk carries an Ed25519 signature, by the
// coordinator's key, over the envelope bytes before it, and Decode refuses
// a table none of the trusted keys verifies (ErrSignature). Reports and
// acks are not signed. Every message names its cluster; a message of
// another cluster is refused (ErrCluster).
//
// # Format
//
// The protobuf wire format, written and read by hand with protowire: no
// generated code, no protoc in the build. wire.proto in this directory is
// the exact schema (field numbers and types), so any language decodes the
// messages with protoc. Writing the codec by hand buys three things a
// generated one does not: every length and count is checked against
// Limits before anything is allocated for it, so a hostile or corrupt
// message cannot make a receiver allocate more than a small multiple of its
// size; ReportSize, TableSize and AckSize compute the exact encoded size
// without allocating, which the simulator needs for every report and table
// it models; and the encoding is deterministic (same input, same bytes).
//
// Choices: every message is an Envelope (version, cluster, kind, body,
// signature). Zero scalars are omitted; repeated scalars are packed
// varints (shares, bursts, leases); times are sint64 µs; a budget is
// (rate, period µs, burst) when the gcra.Limit was built from a rate,
// else (interval µs, burst), so that the decoded Limit equals (==) the
// encoded one; chunk index and count are fixed32, so a chunk's size does
// not depend on how many follow.
//
// Compatibility: unknown fields are skipped, so a field added within
// version 1 does not break older readers; a change they would misread
// bumps Version, and a message of any other version is refused.
//
// # Limits
//
// Limits bounds what a receiver accepts: the size of a message, keys per
// report or table, the length of key and other names, regions, agents per
// region, and chunks per set. DefaultLimits fit 1,048,576 keys. Decode also
// checks what region.Node.Apply and the coordinator rely on (non-negative
// demand, sorted distinct regions and keys, one share per region, Σ shares
// ≤ 10⁶ ppm, valid budgets, times in [0, 2^52) µs), so a table that passes
// Decode and the Assembler is one Apply accepts structurally. Every error
// wraps ErrInvalid and says what was wrong and where.
//
// # Concurrency
//
// The encoders, the size functions and Decode are pure and safe for
// concurrent use. An Assembler is not: one goroutine (the transport's
// receive loop) owns it.
package wire
