package testutil

import "syscall"

// procAttr makes the kernel kill a broker whose test process died (a test binary
// killed by -timeout would otherwise leave brokers running).
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
