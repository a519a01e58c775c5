package gcra

// Stored values. A store that keeps one integer per key (Redis) packs the
// TAT and the epoch tag into one integer below 2^53, exact in a Lua double:
//
//	packed = (TAT mod 2^37)·2^16 + tag
//
// The TAT is read back as the value congruent to the stored one modulo 2^37
// in [now − ReadBehind, now − ReadBehind + 2^37). Live TATs lie in that
// range: a key expires once rested (TAT ≤ now), and no TAT runs more than
// MaxWindow ahead of now. ReadBehind tolerates the store's clock stepping
// back by up to an hour.
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

// Unpack reads a packed state back at now (see Pack).
func Unpack(v, now int64) State {
	tag := uint16(v & (tagMod - 1))
	low := v >> tagBits
	base := now - ReadBehind
	off := ((low-base)%tatMod + tatMod) % tatMod
	return State{TAT: base + off, Epoch: tag, Exists: true}
}
