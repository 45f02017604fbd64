package broker

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/narad-mq/narad/broker/internal/storage/vfs"
)

// ErrCredentialsSealed means a remote child's stored password cannot be opened with any
// key this node has: the cluster secret it was sealed under is gone (rotated out before
// the password was sealed again), or the node's credentials key file was lost.
var ErrCredentialsSealed = errors.New("the remote child's password cannot be opened with this node's keys")

// SecretKeys returns the cluster secrets: the current one and, during a rotation, the
// next (nil when none). Remote children's passwords are sealed under a key derived from
// the current secret and opened with a key derived from either.
type SecretKeys func() (current, next []byte, err error)

// A sealed password is
//
//	magic "NRS1" | key id (8 bytes) | nonce (12 bytes) | AES-256-GCM ciphertext and tag
//
// The key id says which key sealed it, so a node tries the right one and knows when a
// password must be sealed again under the current key. The additional data binds it
// to the remote child's parent, URL, topic and user: a sealed password copied into
// another record does not open.
var sealMagic = []byte("NRS1")

const (
	keyIDLen   = 8
	nonceLen   = 12
	sealedHead = 4 + keyIDLen + nonceLen
	// credentialsKeyFile holds the key of a node without a cluster secret (a lone
	// node), outside meta/: a copy of the control plane's store alone does not hold
	// the passwords in clear.
	credentialsKeyFile = "credentials.key"
)

type sealKey struct {
	id  [keyIDLen]byte
	aed cipher.AEAD
}

// deriveKey makes the sealing key of a secret: HKDF-SHA-256 salted with the cluster id,
// so two clusters that share a secret still do not share keys.
func deriveKey(secret []byte, clusterID string) (sealKey, error) {
	k, err := hkdf.Key(sha256.New, secret, []byte(clusterID), "narad remote-child credentials v1", 32)
	if err != nil {
		return sealKey{}, err
	}
	return newSealKey(k)
}

func newSealKey(k []byte) (sealKey, error) {
	blk, err := aes.NewCipher(k)
	if err != nil {
		return sealKey{}, err
	}
	aed, err := cipher.NewGCM(blk)
	if err != nil {
		return sealKey{}, err
	}
	sum := sha256.Sum256(append([]byte("narad key id\x00"), k...))
	var sk sealKey
	copy(sk.id[:], sum[:keyIDLen])
	sk.aed = aed
	return sk, nil
}

// sealKeys returns the key passwords are sealed under now, then every key one may have
// been sealed under. During a rotation (a next secret is set) passwords are sealed
// under the next secret's key: the one every node keeps once the rotation ends.
func (b *Broker) sealKeys() (sealKey, []sealKey, error) {
	var all []sealKey
	if b.opts.SecretKeys != nil {
		cur, next, err := b.opts.SecretKeys()
		if err != nil {
			return sealKey{}, nil, fmt.Errorf("reading the cluster secret: %w", err)
		}
		for _, s := range [][]byte{next, cur} {
			if len(s) == 0 {
				continue
			}
			k, err := deriveKey(s, b.meta.ClusterID())
			if err != nil {
				return sealKey{}, nil, err
			}
			all = append(all, k)
		}
	}
	// A lone node's own key: the only one without a cluster secret, and still tried
	// with one, for passwords sealed before the node joined a cluster.
	fk, err := b.fileKey(len(all) == 0)
	if err != nil {
		return sealKey{}, nil, err
	}
	if fk != nil {
		all = append(all, *fk)
	}
	if len(all) == 0 {
		return sealKey{}, nil, errors.New("no key to seal credentials with")
	}
	return all[0], all, nil
}

// fileKey reads the node's credentials key, making it when create is set and there is
// none. Nil (no error) when there is none and create is not set.
func (b *Broker) fileKey(create bool) (*sealKey, error) {
	b.credMu.Lock()
	defer b.credMu.Unlock()
	path := filepath.Join(b.opts.DataDir, credentialsKeyFile)
	k, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if !create {
			return nil, nil
		}
		k = make([]byte, 32)
		if _, err := rand.Read(k); err != nil {
			return nil, err
		}
		if err := vfs.WriteFileSync(path, k); err != nil {
			return nil, fmt.Errorf("writing %s: %w", path, err)
		}
		if err := os.Chmod(path, 0o600); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if len(k) != 32 {
		return nil, fmt.Errorf("%s is damaged (%d bytes, want 32); restore it from a backup, or detach and attach the remote children again", path, len(k))
	}
	sk, err := newSealKey(k)
	if err != nil {
		return nil, err
	}
	return &sk, nil
}

// sealPassword encrypts password under the current key, bound to aad.
func (b *Broker) sealPassword(password string, aad []byte) ([]byte, error) {
	cur, _, err := b.sealKeys()
	if err != nil {
		return nil, err
	}
	out := make([]byte, sealedHead, sealedHead+len(password)+cur.aed.Overhead())
	copy(out, sealMagic)
	copy(out[4:], cur.id[:])
	if _, err := rand.Read(out[4+keyIDLen : sealedHead]); err != nil {
		return nil, err
	}
	return cur.aed.Seal(out, out[4+keyIDLen:sealedHead], []byte(password), aad), nil
}

// openPassword decrypts a sealed password; stale says it was sealed under another key
// than the one passwords are sealed under now (it should be sealed again).
func (b *Broker) openPassword(sealed, aad []byte) (password string, stale bool, err error) {
	if len(sealed) < sealedHead || !bytes.Equal(sealed[:4], sealMagic) {
		return "", false, fmt.Errorf("%w: it is not a sealed password", ErrCredentialsSealed)
	}
	cur, all, err := b.sealKeys()
	if err != nil {
		return "", false, err
	}
	for _, k := range all {
		if !bytes.Equal(k.id[:], sealed[4:4+keyIDLen]) {
			continue
		}
		pt, err := k.aed.Open(nil, sealed[4+keyIDLen:sealedHead], sealed[sealedHead:], aad)
		if err != nil {
			return "", false, fmt.Errorf("%w: %v", ErrCredentialsSealed, err)
		}
		return string(pt), k.id != cur.id, nil
	}
	return "", false, ErrCredentialsSealed
}

// staleSeal reports whether sealed was sealed under another key than the one passwords
// are sealed under now (false when the keys cannot be read: nothing to do then).
func (b *Broker) staleSeal(sealed []byte) bool {
	cur, _, err := b.sealKeys()
	return err == nil && len(sealed) >= sealedHead && !bytes.Equal(sealed[4:4+keyIDLen], cur.id[:])
}

// resealInterval is how often the controller looks for remote children's passwords
// sealed under a key that is not the current one (after a rotation of the cluster
// secret began, or a lone node joined a cluster), in nanoseconds. Serial tests (never
// with t.Parallel) shorten it.
var resealInterval atomic.Int64

func init() { resealInterval.Store(int64(5 * time.Second)) }

// resealLoop seals again, on the controller, every remote child's password that is
// sealed under an older key, so a rotation of the cluster secret can drop the old one.
func (b *Broker) resealLoop() {
	tick := time.NewTicker(time.Duration(resealInterval.Load()))
	defer tick.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-tick.C:
		}
		if !b.meta.Leader() {
			continue
		}
		for _, rc := range b.meta.RemoteChildren() {
			if !b.staleSeal(rc.Sealed) {
				continue
			}
			pass, _, err := b.openPassword(rc.Sealed, remoteAAD(rc))
			if err != nil {
				b.log.Error("a remote child's password cannot be opened to seal it under the current cluster secret; detach it and attach it again with the password",
					"parent", rc.Parent, "child", RemoteChildPrefix+strconv.FormatUint(rc.ID, 10), "err", err)
				continue
			}
			sealed, err := b.sealPassword(pass, remoteAAD(rc))
			if now, ok := b.meta.RemoteChild(rc.ID); !ok || !bytes.Equal(now.Sealed, rc.Sealed) {
				continue // detached, or given a new password meanwhile: not to be overwritten
			}
			if err == nil {
				err = b.resealRemote(rc, sealed)
			}
			if err != nil {
				b.log.Warn("sealing a remote child's password under the current cluster secret failed; retried", "child", RemoteChildPrefix+strconv.FormatUint(rc.ID, 10), "err", err)
				continue
			}
			b.log.Info("sealed a remote child's password under the current cluster secret", "parent", rc.Parent, "child", RemoteChildPrefix+strconv.FormatUint(rc.ID, 10))
		}
	}
}
