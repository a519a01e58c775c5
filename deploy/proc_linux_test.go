package deploy_test

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill a started server or agent if the
// test binary dies without running its cleanups (a test timeout).
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
