//go:build !linux

package testutil

import "syscall"

func procAttr() *syscall.SysProcAttr { return nil }
