//go:build !chaosnet

package transport

import "net"

// ChaosNetEnabled reports whether this binary was built with the chaosnet tag.
const ChaosNetEnabled = false

// chaosWrap returns the node-plane socket unchanged: chaosnet is not built in.
func chaosWrap(pc net.PacketConn) net.PacketConn { return pc }
