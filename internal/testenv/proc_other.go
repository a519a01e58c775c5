//go:build !linux

package testenv

import "os/exec"

// setDeathSignal does nothing where the kernel offers no parent-death signal;
// a test process killed before its cleanups may leave servers running.
func setDeathSignal(*exec.Cmd) {}
