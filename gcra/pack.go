package gcra

import (
	"errors"
	"fmt"
)

// Stored values. Every store keeps a key's state as the same ValueLen
// bytes — Redis as the key's string value, gcra/memstore in its entry — so
// the simulator decides on exactly what production stores:
//
//	bytes 0–6    the TAT, µs, big-endian (at most MaxTAT, below 2^53)
//	bytes 7–11   the epoch tag (TagBits = 40 bits), big-endian
//	bytes 12–18  the writer's emission interval T, µs, big-endian
//	bytes 19–23  the writer's burst, big-endian
//
// The TAT is stored whole: it reads back exactly under any later schedule,
// however long the key lives and whatever limits its schedule names by
// then. The limit it was written under (State.T, State.Burst) says what
// unit the TAT counts tokens in, so a reader under another limit converts
// it exactly — whatever epoch the state carries, also one its own schedule
// does not name (a sibling agent of the region that ran the key under
// another epoch slot or a version this reader skipped). Rested is not
// stored; a store's expiry carries it (Redis: PX).
//
// The first byte of a Value is below 0x20, so a Value is never mistaken for
// the decimal integers of the packed format (PackV1) that stores wrote
// before it. The 12-byte value of the release before this one (ValueV2:
// TAT and tag, no limit) is still read, as a state whose writer's limit is
// unknown, and written on request during a rolling upgrade.
const ValueLen = 24

// ValueV2Len is the length of the previous release's value: bytes 0–11
// above, without the writer's limit.
const ValueV2Len = 12

// Value is a key's state as stored.
type Value [ValueLen]byte

// ErrBadValue is returned for stored bytes that are not a Value.
var ErrBadValue = errors.New("gcra: stored value is malformed")

// EncodeValue is st's stored form (st.Exists is assumed; Rested is not
// stored). st.TAT must lie in [0, MaxTAT], st.Epoch be a tag, and st.T and
// st.Burst be a usable limit's or both zero (unknown).
func EncodeValue(st State) Value {
	var v Value
	putBE(v[0:7], uint64(st.TAT))
	putBE(v[7:12], st.Epoch)
	putBE(v[12:19], uint64(st.T))
	putBE(v[19:24], uint64(st.Burst))
	return v
}

// EncodeValueV2 is st in the previous release's 12-byte form: TAT and tag,
// without the writer's limit.
func EncodeValueV2(st State) [ValueV2Len]byte {
	var v [ValueV2Len]byte
	putBE(v[0:7], uint64(st.TAT))
	putBE(v[7:12], st.Epoch)
	return v
}

// DecodeValue reads a stored Value (or a previous release's 12-byte value)
// back: the exact TAT, epoch tag and writer's limit (zero, unknown, for the
// 12-byte form), with Exists set. It fails with ErrBadValue for anything of
// another length, a TAT above MaxTAT, or a writer's limit no store could
// have decided under.
func DecodeValue(b []byte) (State, error) {
	if len(b) != ValueLen && len(b) != ValueV2Len {
		return State{}, fmt.Errorf("%w: %d bytes, want %d (or %d)", ErrBadValue, len(b), ValueLen, ValueV2Len)
	}
	t := getBE(b[0:7])
	if t > uint64(MaxTAT) {
		return State{}, fmt.Errorf("%w: TAT %d µs above MaxTAT", ErrBadValue, t)
	}
	st := State{TAT: int64(t), Epoch: getBE(b[7:12]), Exists: true}
	if len(b) == ValueLen {
		wt, wb := int64(getBE(b[12:19])), int64(getBE(b[19:24]))
		if (wt != 0 || wb != 0) && !FromInterval(wt, wb).usable() {
			return State{}, fmt.Errorf("%w: writer's limit T=%dµs burst %d is not a usable limit", ErrBadValue, wt, wb)
		}
		st.T, st.Burst = wt, wb
	}
	return st, nil
}

// putBE writes x big-endian into b, keeping its low len(b) bytes.
func putBE(b []byte, x uint64) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte(x)
		x >>= 8
	}
}

// getBE reads b as a big-endian unsigned integer.
func getBE(b []byte) uint64 {
	var x uint64
	for _, c := range b {
		x = x<<8 | uint64(c)
	}
	return x
}

// The packed format (V1) is what stores wrote before Value: one integer
// below 2^53, exact in a Lua double,
//
//	packed = (TAT mod 2^37)·2^16 + (epoch tag mod 2^16)
//
// It loses the TAT's high bits and the tag's, so reading it back needs a
// guess of where the TAT lies; the guess fails for a state that outlives
// the schedule that wrote it (issue 14: a daily key blocked for 13 hours).
// Stores still read it — keys written by an older release, and the keys a
// store writes in this format while older agents share its Redis during a
// rolling upgrade (redisstore.Config.WriteFormat) — and never misread it
// towards admitting: see UnpackV1.
const (
	v1TATBits = 37
	v1TagBits = 16
	v1TATMod  = int64(1) << v1TATBits
	v1TagMod  = int64(1) << v1TagBits

	// V1MaxWindow is the longest window (Burst·T, plus maxWait for a
	// reservation) a key may have while its state is kept in the packed
	// format: the older release's MaxWindow. Older agents read a packed TAT
	// within 2^37 − 2^32 µs (≈ 36.9 h) ahead of now; a window above this
	// would be misread by them as far behind.
	V1MaxWindow = int64(36*3600) * 1_000_000

	// V1ReadBehind is how far behind now the older release reads a packed
	// TAT (ReadRefV1).
	V1ReadBehind = int64(1) << 32 // ≈ 71.6 minutes in µs

	// V1ExpirySlack is the allowance (60 s) UnpackV1's callers add to a
	// key's expiry: it is set in whole milliseconds on the server's
	// millisecond clock, so it may lie a millisecond or two before Rested.
	// Any slack well below 2^37 µs reads the same TAT; a generous one also
	// covers a test that moves its explicit now apart from the server's
	// clock by a little.
	V1ExpirySlack = 60_000_000
)

// PackV1 is st in the packed format.
func PackV1(st State) int64 {
	return ((st.TAT%v1TATMod+v1TATMod)%v1TATMod)<<v1TagBits | int64(st.Epoch&uint64(v1TagMod-1))
}

// UnpackV1 reads a packed value back. The TAT is the latest instant
// congruent to the stored one modulo 2^37 that is not after upper — for a
// key with an expiry, upper = now + its remaining time to live +
// V1ExpirySlack: a key's expiry is its Rested, never before its TAT, and
// never more than 2^37 µs (≈ 38 h) after it for any state a store writes, so
// the TAT read is exact. (The older release read relative to ReadRefV1
// instead, which fails once the state outlives its schedule.) For a key
// without an expiry, pass ReadRefV1 − V1ReadBehind + 2^37 − 1.
//
// The epoch tag is widened to TagBits relative to the schedule's current
// epoch: the tag nearest to it with the same low 16 bits. For a schedule
// whose two epochs are within 2^15 of each other (the older release's
// Validate required it), a state written under either reads back under it,
// and any other tag reads as newer or older exactly as the older release
// compared them.
func UnpackV1(v, upper int64, s *Schedule) State {
	low := v >> v1TagBits
	off := ((upper-low)%v1TATMod + v1TATMod) % v1TATMod
	cur := EpochTag(s.Current.Epoch)
	d := (uint64(v)-cur)&uint64(v1TagMod-1) ^ 1<<(v1TagBits-1) // bias by 2^15
	tag := (cur + d - 1<<(v1TagBits-1)) & tagMask
	return State{TAT: upper - off, Epoch: tag, Exists: true}
}

// ReadRefV1 is the older release's reference time for a packed state with
// 16-bit tag tag at now under s: the current limit's effective time for a
// state written under the previous limit of a change already in effect,
// now otherwise. It reads the TAT in [ref − V1ReadBehind,
// ref − V1ReadBehind + 2^37).
func ReadRefV1(s *Schedule, tag uint16, now int64) int64 {
	if s.HasPrevious && uint64(tag) == s.Previous.Epoch&uint64(v1TagMod-1) && s.Current.Effective < now {
		return s.Current.Effective
	}
	return now
}
