// Package netns builds the cluster tier's own network: one Linux network namespace per
// host (the verifier and each node), joined by a bridge in a hub namespace, and cuts
// it with iptables inside the hosts' namespaces. The kernel then drops the packets, so
// what a node sees is what a real network fault does to it: a UDP (QUIC) node plane
// that goes silent, one way or both, or loses some packets.
//
// Nothing is made outside the namespaces: the veth pairs are created straight into
// them, addresses are 10.<subnet>.0.x inside them, and Close deletes every namespace
// (and with it its interfaces and rules). It needs root, iproute2 and iptables.
package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Host is one namespace of the network.
type Host struct {
	Name string // as given to Setup
	NS   string // the namespace's name
	IP   string // its address on the bridge
}

// Net is a set of namespaces joined by a bridge.
type Net struct {
	Prefix string
	Subnet int
	Hosts  []Host
	hub    string
}

// hostIP is the address of host i: 10.subnet.0.(10+i).
func hostIP(subnet, i int) string { return fmt.Sprintf("10.%d.0.%d", subnet, 10+i) }

// Layout names the namespaces of prefix and hosts without making them (what Setup
// makes, and what a process started inside one of them uses to find the others).
func Layout(prefix string, subnet int, names []string) *Net {
	n := &Net{Prefix: prefix, Subnet: subnet, hub: prefix + "-hub"}
	for i, name := range names {
		n.Hosts = append(n.Hosts, Host{Name: name, NS: prefix + "-" + name, IP: hostIP(subnet, i)})
	}
	return n
}

// Check reports what this machine lacks for Setup, with what to do about it.
func Check() error {
	if os.Geteuid() != 0 {
		return errors.New("netns: network namespaces need root")
	}
	for _, bin := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("netns: %s is not installed (apt-get install iproute2 iptables)", bin)
		}
	}
	return nil
}

// Setup makes the namespaces of Layout(prefix, subnet, names): a hub with a bridge, and
// per host a namespace with loopback and one veth into the bridge. On an error it
// removes what it made.
func Setup(ctx context.Context, prefix string, subnet int, names []string) (*Net, error) {
	if err := Check(); err != nil {
		return nil, err
	}
	if subnet < 1 || subnet > 254 || len(names) > 200 {
		return nil, fmt.Errorf("netns: subnet %d or %d hosts out of range", subnet, len(names))
	}
	n := Layout(prefix, subnet, names)
	steps := [][]string{
		{"netns", "add", n.hub},
		{"-n", n.hub, "link", "set", "lo", "up"},
		{"-n", n.hub, "link", "add", "br0", "type", "bridge"},
		{"-n", n.hub, "link", "set", "br0", "up"},
	}
	for i, h := range n.Hosts {
		port := fmt.Sprintf("v%d", i)
		steps = append(steps,
			[]string{"netns", "add", h.NS},
			[]string{"link", "add", "eth0", "netns", h.NS, "type", "veth", "peer", "name", port, "netns", n.hub},
			[]string{"-n", h.NS, "addr", "add", h.IP + "/24", "dev", "eth0"},
			[]string{"-n", h.NS, "link", "set", "lo", "up"},
			[]string{"-n", h.NS, "link", "set", "eth0", "up"},
			[]string{"-n", n.hub, "link", "set", port, "master", "br0"},
			[]string{"-n", n.hub, "link", "set", port, "up"},
		)
	}
	for _, s := range steps {
		if err := run(ctx, "ip", s...); err != nil {
			_ = n.Close()
			return nil, err
		}
	}
	return n, nil
}

// Host returns the host of that name.
func (n *Net) Host(name string) (Host, bool) {
	for _, h := range n.Hosts {
		if h.Name == name {
			return h, true
		}
	}
	return Host{}, false
}

// Close deletes every namespace of the network (those that exist), and so their
// interfaces and rules.
func (n *Net) Close() error {
	var errs []error
	for _, ns := range append([]string{n.hub}, n.nsNames()...) {
		if _, err := os.Stat("/run/netns/" + ns); err != nil {
			continue
		}
		if err := run(context.Background(), "ip", "netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (n *Net) nsNames() []string {
	var out []string
	for _, h := range n.Hosts {
		out = append(out, h.NS)
	}
	return out
}

// Command is cmd args run inside host's namespace (`ip netns exec` replaces itself
// with the command, so the process's PID is the command's).
func (n *Net) Command(host Host, cmd string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", host.NS, cmd}, args...)...)
}

// Drop is one iptables rule of a host's namespace: it drops UDP packets (the node
// plane; HTTP is TCP and is left alone, so the verifier still sees the node).
type Drop struct {
	// Out drops what the host sends (its sends then fail with EPERM, as under a local
	// firewall); otherwise what it receives, which its peers cannot tell from a lossy
	// network.
	Out bool
	// Peer limits the rule to packets from (or to) this address; "" for any.
	Peer string
	// P is the share dropped: 1 all, below 1 that share at random.
	P float64
}

// Fault is what a host's namespace drops; the zero Fault drops nothing.
type Fault []Drop

// Rules are the iptables rules of f, for a namespace's filter table.
func (f Fault) Rules() [][]string {
	var out [][]string
	for _, d := range f {
		if d.P <= 0 {
			continue
		}
		chain, iface, dir := "INPUT", "-i", "-s"
		if d.Out {
			chain, iface, dir = "OUTPUT", "-o", "-d"
		}
		r := []string{"-A", chain, "-p", "udp", "!", iface, "lo"}
		if d.Peer != "" {
			r = append(r, dir, d.Peer)
		}
		if d.P < 1 {
			r = append(r, "-m", "statistic", "--mode", "random", "--probability", fmt.Sprintf("%.4f", d.P))
		}
		out = append(out, append(r, "-j", "DROP"))
	}
	return out
}

// Apply replaces host's rules by f's (nil heals it).
func (n *Net) Apply(ctx context.Context, host Host, f Fault) error {
	for _, chain := range []string{"INPUT", "OUTPUT"} {
		if err := run(ctx, "ip", "netns", "exec", host.NS, "iptables", "-w", "-F", chain); err != nil {
			return err
		}
	}
	for _, r := range f.Rules() {
		if err := run(ctx, "ip", append([]string{"netns", "exec", host.NS, "iptables", "-w"}, r...)...); err != nil {
			return err
		}
	}
	return nil
}

func run(ctx context.Context, bin string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("netns: %s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}
