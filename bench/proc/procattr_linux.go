package proc

import "syscall"

// procAttr makes the kernel kill a server whose benchmark died (a run stopped with
// kill -9, or a test binary killed by -timeout, would otherwise leave it running).
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
