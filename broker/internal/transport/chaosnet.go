package transport

// Chaosnet: a fault-injecting packet socket under the node plane, for tests of a
// cluster of real processes (verify's cluster tier). QUIC runs over UDP, so TCP proxies
// cannot cut it, and network namespaces need root; a binary built with the build tag
// `chaosnet` instead wraps its node-plane socket in a connection that obeys a rules
// file, named by ChaosNetEnvVar and read again every ChaosNetPoll while the node runs.
// Without the tag (every normal build) chaosWrap returns the socket unchanged and
// nothing reads the environment.
//
// The rules file holds one rule a line ("#" starts a comment; an empty file, or none,
// means no faults):
//
//	drop  in|out PROB [ADDR]        lose packets received (in) or sent (out) with probability PROB (0–1)
//	delay out    DURATION [JITTER] [ADDR]  hold sent packets DURATION ± JITTER (so they also reorder)
//	dup   out    PROB [ADDR]        send packets twice with probability PROB
//
// ADDR (host:port, a peer's cluster address) limits a rule to packets from or to that
// peer. Examples: "drop in 1" and "drop out 1" together cut the node off both ways;
// "drop in 1" alone makes a deaf node that still sends; "drop out 1" a mute one;
// "drop in 0.05" and "drop out 0.05" random loss. A file that does not parse is
// reported on stderr and leaves the previous rules in force.

import "time"

// ChaosNetEnvVar names the rules file a chaosnet build reads.
const ChaosNetEnvVar = "NARAD_CHAOSNET_FILE"

// ChaosNetPoll is how often a chaosnet build reads its rules file again.
const ChaosNetPoll = 100 * time.Millisecond

// ChaosNetPrefix starts the stderr lines of a chaosnet build ("narad chaosnet: on
// file=…" at start, then every change of rules), so a harness can tell it is armed.
const ChaosNetPrefix = "narad chaosnet:"
