package gcra

// Stored values. A store that keeps one integer per key (Redis) packs the
// TAT and the epoch tag into one integer below 2^53, exact in a Lua double:
//
//	packed = (TAT mod 2^37)·2^16 + tag
//
// The TAT is read back as the value congruent to the stored one modulo 2^37
// in [ref − ReadBehind, ref − ReadBehind + 2^37), where ref is ReadRef's
// reference time. Live TATs lie in that range. A state written under the
// limit in force expires once rested (TAT ≤ now) and never runs more than
// MaxWindow ahead of now; ReadBehind tolerates the store's clock stepping
// back by up to an hour. A state written under the previous limit of a
// change may outlive its TAT by far (its expiry is the converted TAT, see
// State.Rested), but its TAT lies within MaxWindow after the change's
// effective time, so it is read relative to that time.
const (
	tatBits = 37
	tagBits = 16
	tatMod  = int64(1) << tatBits
	tagMod  = int64(1) << tagBits

	// ReadBehind is how far in the past of now a packed TAT may lie and
	// still be read back exactly.
	ReadBehind = int64(1) << 32 // ≈ 71.6 minutes in µs
)

// Pack packs a state into one integer below 2^53.
func Pack(st State) int64 {
	return ((st.TAT%tatMod+tatMod)%tatMod)<<tagBits | int64(st.Epoch)
}

// ReadRef is the reference time for unpacking a state with epoch tag tag
// at now under s: the current limit's effective time for a state written
// under the previous limit of a change already in effect, now otherwise.
func ReadRef(s *Schedule, tag uint16, now int64) int64 {
	if s.HasPrevious && tag == EpochTag(s.Previous.Epoch) && s.Current.Effective < now {
		return s.Current.Effective
	}
	return now
}

// Unpack reads a packed state back relative to ref (see ReadRef).
func Unpack(v, ref int64) State {
	tag := uint16(v & (tagMod - 1))
	low := v >> tagBits
	base := ref - ReadBehind
	off := ((low-base)%tatMod + tatMod) % tatMod
	return State{TAT: base + off, Epoch: tag, Exists: true}
}
