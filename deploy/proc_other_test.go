//go:build !linux

package deploy_test

import "os/exec"

// setDeathSignal does nothing where the kernel offers no parent-death
// signal; t.Cleanup still stops every process.
func setDeathSignal(*exec.Cmd) {}
