package testutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

var (
	rootOnce sync.Once
	rootDir  string
	rootErr  error
)

// WorkspaceRoot returns the directory holding go.work, found by walking up from the
// working directory (a test's working directory is its package directory).
func WorkspaceRoot() (string, error) {
	rootOnce.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			rootErr = err
			return
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
				rootDir = dir
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				rootErr = errors.New("testutil: no go.work above the working directory")
				return
			}
			dir = parent
		}
	})
	return rootDir, rootErr
}

// BrokerModuleDir returns the broker module's directory (<workspace>/broker).
func BrokerModuleDir() (string, error) {
	root, err := WorkspaceRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "broker")
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return "", fmt.Errorf("testutil: broker module not found: %w", err)
	}
	return dir, nil
}

// SpecPath returns the path of openapi.yaml at the workspace root.
func SpecPath() (string, error) {
	root, err := WorkspaceRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "openapi.yaml"), nil
}
