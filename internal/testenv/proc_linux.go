package testenv

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill the child if the test process dies
// without running its cleanups (e.g. on a test timeout).
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
