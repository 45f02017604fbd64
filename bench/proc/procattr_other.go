//go:build !linux

package proc

import "syscall"

func procAttr() *syscall.SysProcAttr { return nil }
