package runner

import (
	"os/exec"
	"syscall"
)

// dieWithRunner makes the child get SIGTERM if the runner dies first (killed, say), so
// no broker outlives a run.
func dieWithRunner(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
