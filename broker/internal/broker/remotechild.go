package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/partition"
	"github.com/narad-mq/narad/broker/internal/storage/segment"
)

// AttrRemoteCopy marks a record stored from a produce-batch message that carried an
// origin: a copy another cluster's remote child made. Remote children never send such
// a record on, so a ring of remote children (A to B to A) copies each message once.
const AttrRemoteCopy uint16 = 1 << 2

// RemoteChildPrefix starts a remote child's id in the children routes. Topic names
// cannot hold ':', so an id is never taken for a child topic's name.
const RemoteChildPrefix = "remote:"

// Limits of remote children and of the copies they send.
const (
	MaxRemoteURLLen = 2048
	MaxCAPEMBytes   = 64 << 10
	MaxClusterIDLen = 128
)

// ErrIncarnationMismatch means a produce named another incarnation of the topic than
// the one of that name now (it was deleted and created again); nothing was written.
var ErrIncarnationMismatch = errors.New("topic incarnation mismatch")

// ErrRemoteRefused means attaching a remote child, or giving it a new password, failed
// on the remote's side (it is unreachable, refuses the credentials, has no such topic);
// the message says which.
var ErrRemoteRefused = errors.New("the remote cluster refused")

// ProduceCheck holds the checks a produce-batch request may ask for besides the usual.
type ProduceCheck struct {
	// Incarnation, when not empty, is the topic incarnation the batch is meant for.
	Incarnation string
	// ValidateOnly: check the topic (and Incarnation, Origins) and write nothing.
	ValidateOnly bool
	// Origins are the origins the messages carry (copies from a remote child).
	Origins []Origin
}

// Origin is where a copy made by a remote child comes from.
type Origin struct {
	ClusterID, Topic string
	Partition        int32
	Offset           uint64
}

// checkProduce applies a ProduceCheck to topic t.
func (b *Broker) checkProduce(t *topic, chk ProduceCheck) error {
	if chk.Incarnation != "" && chk.Incarnation != strconv.FormatUint(t.incarnation, 10) {
		return fmt.Errorf("%w: topic %s is incarnation %d, not %s: it was deleted and created again since; nothing was written", ErrIncarnationMismatch, t.name, t.incarnation, chk.Incarnation)
	}
	if id := b.ClusterID(); id != "" {
		for _, o := range chk.Origins {
			if o.ClusterID == id && o.Topic == t.name {
				return &ConflictError{Msg: "these messages come from topic " + t.name + " of this very cluster: a topic cannot be its own remote child; nothing was written"}
			}
		}
	}
	return nil
}

// RemoteSpec is what attaching a remote child takes.
type RemoteSpec struct {
	URL, Topic, Username, Password, CAPEM string
	// Start is "now" (default) or "earliest".
	Start string
	// OwnerID is the user attaching it (0: security off).
	OwnerID uint64
}

// RemoteChildInfo describes a remote child for listing. It never holds the password.
type RemoteChildInfo struct {
	ID                                           string
	URL, Topic, Username, Incarnation, ClusterID string
	Start                                        string
	// State is running, paused or failing; Reason says why when not running.
	State, Reason string
	Lag           []RemoteLag
}

// RemoteLag is a remote child's copy of one parent partition.
type RemoteLag struct {
	Partition          int32
	ParentNext, Cursor uint64
	LagSeconds         float64
	// State is copying, paused or failing ("" for a partition another node holds and
	// copies: ask that node).
	State, Reason, LastError string
	// Expired counts the messages retention deleted before they were copied.
	Expired uint64
}

// remoteChildID parses "remote:<n>"; false when id is not a remote child's.
func remoteChildID(id string) (uint64, bool) {
	s, ok := strings.CutPrefix(id, RemoteChildPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil && n > 0
}

// IsRemoteChildID reports whether a children route's {child} names a remote child.
func IsRemoteChildID(id string) bool { return strings.HasPrefix(id, RemoteChildPrefix) }

func remoteAAD(r meta.RemoteChild) []byte {
	return []byte(r.Parent + "\x00" + r.URL + "\x00" + r.Topic + "\x00" + r.Username)
}

// AttachRemoteChild makes topic spec.Topic of the cluster at spec.URL a child of
// parent. It checks, before anything is stored, that the remote topic exists and that
// the credentials may produce to it.
func (b *Broker) AttachRemoteChild(ctx context.Context, parent string, spec RemoteSpec) (RemoteChildInfo, error) {
	if err := b.ensureReady(); err != nil {
		return RemoteChildInfo{}, err
	}
	if err := errors.Join(checkName(parent), checkName(spec.Topic)); err != nil {
		return RemoteChildInfo{}, firstInvalid(err)
	}
	switch spec.Start {
	case "":
		spec.Start = "now"
	case "now", "earliest":
	default:
		return RemoteChildInfo{}, invalid(apigen.ErrorCodeInvalidParameter, "remote.start must be now or earliest, got %q", truncate(spec.Start, 32))
	}
	if spec.Username == "" || len(spec.Password) < auth.MinPasswordBytes || len(spec.Password) > auth.MaxPasswordBytes {
		return RemoteChildInfo{}, invalid(apigen.ErrorCodeInvalidParameter, "remote.username and remote.password (%d to %d bytes) are required: the user the copy produces as on the remote cluster", auth.MinPasswordBytes, auth.MaxPasswordBytes)
	}
	if len(spec.URL) > MaxRemoteURLLen || len(spec.CAPEM) > MaxCAPEMBytes {
		return RemoteChildInfo{}, invalid(apigen.ErrorCodeInvalidParameter, "remote.url is at most %d bytes and remote.ca_pem at most %d", MaxRemoteURLLen, MaxCAPEMBytes)
	}
	u, err := checkRemoteURL(spec.URL)
	if err != nil {
		return RemoteChildInfo{}, err
	}
	spec.URL = strings.TrimSuffix(u.String(), "/")
	pt, err := b.lookup(parent)
	if err != nil {
		return RemoteChildInfo{}, err
	}
	cl, err := newRemoteClient(spec.URL, spec.Topic, spec.Username, spec.Password, spec.CAPEM)
	if err != nil {
		return RemoteChildInfo{}, err
	}
	defer cl.close()
	tgt := remoteTarget{url: spec.URL, topic: spec.Topic, user: spec.Username}
	refused := func(err error) error {
		return fmt.Errorf("%w: %s; nothing was attached", ErrRemoteRefused, attachRefusal(err, tgt))
	}
	// The cluster id is only shown (an older remote may not tell it); the topic and
	// the produce grant are what must hold.
	remoteCluster, err := cl.clusterID(ctx)
	var ae *RemoteAnswerError
	if err != nil && !errors.As(err, &ae) {
		return RemoteChildInfo{}, refused(err)
	}
	if ae != nil && ae.Status == http.StatusUnauthorized {
		return RemoteChildInfo{}, refused(err)
	}
	inc, parts, err := cl.topicInfo(ctx)
	if err != nil {
		return RemoteChildInfo{}, refused(err)
	}
	if err := cl.produce(ctx, b.remoteProbe(parent, inc)); err != nil {
		return RemoteChildInfo{}, refused(err)
	}
	start, parentInc, oldest, err := b.remoteStart(pt)
	if err != nil {
		return RemoteChildInfo{}, err
	}
	if spec.Start == "earliest" {
		start = oldest
	}
	rc := meta.RemoteChild{
		Parent: parent, ParentIncarnation: parentInc, URL: spec.URL, Topic: spec.Topic, Username: spec.Username,
		CAPEM: spec.CAPEM, RemoteIncarnation: inc, RemoteClusterID: remoteCluster, RemotePartitions: parts,
		Start: spec.Start, OwnerID: spec.OwnerID, CreatedAtMs: partition.WallMillis(), Cursors: start,
	}
	if rc.Sealed, err = b.sealPassword(spec.Password, remoteAAD(rc)); err != nil {
		return RemoteChildInfo{}, errors.Join(ErrStorage, err)
	}
	got, err := b.meta.AttachRemoteChild(rc)
	if err != nil {
		return RemoteChildInfo{}, mapMetaErr(err)
	}
	b.log.Info("remote child attached", "parent", parent, "child", RemoteChildPrefix+strconv.FormatUint(got.ID, 10),
		"url", got.URL, "topic", got.Topic, "start", got.Start)
	if err := b.reconcile(false); err != nil {
		return RemoteChildInfo{}, errors.Join(ErrStorage, err)
	}
	infos, err := b.RemoteChildren(parent)
	if err != nil {
		return RemoteChildInfo{}, err
	}
	for _, ci := range infos {
		if ci.ID == RemoteChildPrefix+strconv.FormatUint(got.ID, 10) {
			return ci, nil
		}
	}
	return RemoteChildInfo{}, ErrChildNotFound // detached at once by another request
}

func ref[T any](v T) *T { return &v }

// remoteProbe is the validate-only produce-batch that asks a remote, before anything is
// stored here, whether its topic is incarnation inc and takes a copy of parent's from
// these credentials: one message, written nowhere.
func (b *Broker) remoteProbe(parent, inc string) *apigen.ProduceBatchRequest {
	return &apigen.ProduceBatchRequest{Incarnation: &inc, ValidateOnly: ref(true), Messages: []apigen.OutgoingMessage{{
		Payload: json.RawMessage(`{}`),
		Origin:  &apigen.MessageOrigin{ClusterId: b.ClusterID(), Topic: parent},
	}}}
}

// remoteStart reads per parent partition the tail and the oldest offset held, and the
// parent's incarnation they were read from.
func (b *Broker) remoteStart(t *topic) (tail []uint64, inc uint64, oldest []uint64, err error) {
	stats, errs := b.allStats(context.Background(), t)
	tail, oldest = make([]uint64, len(t.parts())), make([]uint64, len(t.parts()))
	for i := range t.parts() {
		if errs[i] != nil {
			return nil, 0, nil, errs[i]
		}
		tail[i], oldest[i] = stats[i].End, stats[i].Oldest
	}
	return tail, t.incarnation, oldest, nil
}

// remoteChildOf finds remote child id of parent.
func (b *Broker) remoteChildOf(parent, id string) (meta.RemoteChild, error) {
	if err := checkName(parent); err != nil {
		return meta.RemoteChild{}, err
	}
	n, ok := remoteChildID(id)
	if !ok {
		return meta.RemoteChild{}, invalid(apigen.ErrorCodeInvalidParameter, "%q is not a remote child's id; ids look like remote:7 (GET /v1/topics/%s/children lists them)", truncate(id, 64), parent)
	}
	rc, ok := b.meta.RemoteChild(n)
	if !ok || rc.Parent != parent {
		if _, ok := b.meta.Topic(parent); !ok {
			return meta.RemoteChild{}, ErrTopicNotFound // as every other route of a topic says
		}
		return meta.RemoteChild{}, ErrChildNotFound
	}
	return rc, nil
}

// DetachRemoteChild stops the copy to remote child id and forgets its credentials and
// cursor.
func (b *Broker) DetachRemoteChild(ctx context.Context, parent, id string) error {
	if err := b.ensureReady(); err != nil {
		return err
	}
	rc, err := b.remoteChildOf(parent, id)
	if err != nil {
		return err
	}
	if err := b.meta.DetachRemoteChild(parent, rc.ID); err != nil {
		return mapMetaErr(err)
	}
	b.log.Info("remote child detached", "parent", parent, "child", id, "url", rc.URL, "topic", rc.Topic)
	return b.reconcile(false)
}

// PauseRemoteChild pauses (paused) or resumes the copy to remote child id. A child
// topic of this cluster is a ConflictError: it cannot be paused.
func (b *Broker) PauseRemoteChild(ctx context.Context, parent, id string, paused bool) error {
	if err := b.ensureReady(); err != nil {
		return err
	}
	if !IsRemoteChildID(id) {
		if err := checkName(id); err != nil {
			return err
		}
		return &ConflictError{Msg: "only a remote child's copy can be paused or resumed; " + id + " is a child topic of this cluster: detach it to stop its copy"}
	}
	rc, err := b.remoteChildOf(parent, id)
	if err != nil {
		return err
	}
	if rc.Paused == paused {
		return nil
	}
	if err := b.meta.PauseRemoteChild(rc.ID, paused); err != nil {
		return mapMetaErr(err)
	}
	return b.reconcile(false)
}

// UpdateRemoteCredentials replaces the password remote child id produces with (the
// remote user's password changed): the copy goes on from its cursor, nothing skipped or
// sent again. The remote is asked first, as at attach, whether the password is taken and
// may produce to the topic; a password it refuses is not stored (ErrRemoteRefused).
func (b *Broker) UpdateRemoteCredentials(ctx context.Context, parent, id, password string) error {
	if err := b.ensureReady(); err != nil {
		return err
	}
	if !IsRemoteChildID(id) {
		if err := checkName(id); err != nil {
			return err
		}
		return &ConflictError{Msg: "only a remote child has credentials; " + id + " is a child topic of this cluster"}
	}
	if len(password) < auth.MinPasswordBytes || len(password) > auth.MaxPasswordBytes {
		return invalid(apigen.ErrorCodeInvalidParameter, "password is required, %d to %d bytes: the remote user's new password", auth.MinPasswordBytes, auth.MaxPasswordBytes)
	}
	rc, err := b.remoteChildOf(parent, id)
	if err != nil {
		return err
	}
	cl, err := newRemoteClient(rc.URL, rc.Topic, rc.Username, password, rc.CAPEM)
	if err != nil {
		return err
	}
	defer cl.close()
	if err := cl.produce(ctx, b.remoteProbe(parent, rc.RemoteIncarnation)); err != nil {
		return fmt.Errorf("%w: %s; the stored password was kept", ErrRemoteRefused, passwordRefusal(err, remoteTarget{url: rc.URL, topic: rc.Topic, user: rc.Username}))
	}
	sealed, err := b.sealPassword(password, remoteAAD(rc))
	if err != nil {
		return errors.Join(ErrStorage, err)
	}
	if err := b.resealRemote(rc, sealed); err != nil {
		return mapMetaErr(err)
	}
	b.log.Info("remote child's password replaced", "parent", parent, "child", id, "url", rc.URL, "topic", rc.Topic, "username", rc.Username)
	return b.reconcile(false)
}

// resealRemote stores sealed as remote child rc's password, sealed for its URL and user.
// Once the cluster speaks update_remote, only while the child still holds rc.Sealed: a
// password given (or resealed) meanwhile, or an update in place of its URL or user, is
// not overwritten (a ConflictError), since a password sealed for another URL or user
// than the child's cannot be opened.
func (b *Broker) resealRemote(rc meta.RemoteChild, sealed []byte) error {
	if b.meta.Allows(meta.FeatureRemoteUpdate) {
		_, err := b.meta.UpdateRemoteChild(rc.ID, rc.URL, rc.Username, rc.CAPEM, sealed, rc.Sealed, 0)
		return err
	}
	return b.meta.ResealRemoteChild(rc.ID, sealed)
}

// bodyNames words a refusal of the URL or CA checks shared with attach, which name the
// attach body's members (remote.url), by the update body's (url).
func bodyNames(err error) error {
	var ie *InvalidError
	if !errors.As(err, &ie) {
		return err
	}
	r := strings.NewReplacer("remote.url", "url", "remote.ca_pem", "ca_pem", "remote.username", "username", "remote.password", "password")
	return &InvalidError{Code: ie.Code, Msg: r.Replace(ie.Msg)}
}

// RemoteUpdate is what an update of a remote child changes (nil: kept). CAPEM "" goes
// back to the system's CAs. OwnerID is the user making the change (0: security off):
// the child is theirs from now on, as if they had attached it.
type RemoteUpdate struct {
	URL, Username, Password, CAPEM *string
	OwnerID                        uint64
}

// UpdateRemoteChild changes how remote child id reaches its remote: its URL (the remote
// cluster moved, or is reached by another name), the user it produces as, its password,
// and the CA certificates of an https URL. The copy goes on from its cursor, so
// nothing is skipped or sent again. The remote at the new settings is asked first, as
// at attach: it must be the same cluster (it must tell the id recorded at attach, when
// one was) and the same
// topic incarnation, and take the credentials for a produce; nothing is changed when it
// refuses (ErrRemoteRefused). A password not given is the stored one, which is never
// sent to a new URL or under new CA certificates: those need the password.
func (b *Broker) UpdateRemoteChild(ctx context.Context, parent, id string, u RemoteUpdate) (RemoteChildInfo, error) {
	if err := b.ensureReady(); err != nil {
		return RemoteChildInfo{}, err
	}
	if !IsRemoteChildID(id) {
		if err := checkName(id); err != nil {
			return RemoteChildInfo{}, err
		}
		return RemoteChildInfo{}, &ConflictError{Msg: "only a remote child has a URL and credentials; " + id + " is a child topic of this cluster"}
	}
	switch {
	case u.URL == nil && u.Username == nil && u.Password == nil && u.CAPEM == nil:
		return RemoteChildInfo{}, invalid(apigen.ErrorCodeInvalidParameter, "give at least one of url, username, password and ca_pem: what to change")
	case u.Username != nil && (*u.Username == "" || len(*u.Username) > auth.MaxUsernameLen):
		return RemoteChildInfo{}, invalid(apigen.ErrorCodeInvalidParameter, "username is the remote user the copy produces as, 1 to %d bytes", auth.MaxUsernameLen)
	case u.Username != nil && u.Password == nil:
		return RemoteChildInfo{}, invalid(apigen.ErrorCodeInvalidParameter, "a new username needs its password: give password too")
	case u.Password != nil && (len(*u.Password) < auth.MinPasswordBytes || len(*u.Password) > auth.MaxPasswordBytes):
		return RemoteChildInfo{}, invalid(apigen.ErrorCodeInvalidParameter, "password is the remote user's password, %d to %d bytes", auth.MinPasswordBytes, auth.MaxPasswordBytes)
	case u.URL != nil && len(*u.URL) > MaxRemoteURLLen, u.CAPEM != nil && len(*u.CAPEM) > MaxCAPEMBytes:
		return RemoteChildInfo{}, invalid(apigen.ErrorCodeInvalidParameter, "url is at most %d bytes and ca_pem at most %d", MaxRemoteURLLen, MaxCAPEMBytes)
	}
	next := func(rc meta.RemoteChild) (meta.RemoteChild, error) {
		if u.URL != nil {
			pu, err := checkRemoteURL(*u.URL)
			if err != nil {
				return rc, err
			}
			rc.URL = strings.TrimSuffix(pu.String(), "/")
		}
		if u.Username != nil {
			rc.Username = *u.Username
		}
		if u.CAPEM != nil {
			rc.CAPEM = *u.CAPEM
		}
		return rc, nil
	}
	rc, err := b.remoteChildOf(parent, id)
	if err != nil {
		return RemoteChildInfo{}, err
	}
	to, err := next(rc)
	if err != nil {
		return RemoteChildInfo{}, bodyNames(err)
	}
	if u.Password == nil && (to.URL != rc.URL || to.CAPEM != rc.CAPEM) {
		// The stored password is never shown: sent to a new URL, or to whatever
		// server new CA certificates trust, it would be shown to that server (in the
		// Basic auth header of the first request) by anyone who may change the child
		// without knowing it. It goes only where it went before.
		return RemoteChildInfo{}, invalid(apigen.ErrorCodeInvalidParameter, "a new url or ca_pem needs the remote user's password: give password too (the stored one is sent only where it was sent before)")
	}
	if !b.meta.Allows(meta.FeatureRemoteUpdate) {
		return RemoteChildInfo{}, mapMetaErr(fmt.Errorf("%w: changing a remote child in place needs cluster version %d and the cluster runs %d", meta.ErrVersionGated, meta.FeatureRemoteUpdate.Since, b.meta.ClusterVersion()))
	}
	var pass string
	if u.Password != nil {
		pass = *u.Password
	} else if pass, _, err = b.openPassword(rc.Sealed, remoteAAD(rc)); err != nil {
		return RemoteChildInfo{}, &ConflictError{Msg: "the stored password of " + id + " cannot be opened (" + err.Error() + "); give the remote user's password with the change"}
	}
	cl, err := newRemoteClient(to.URL, to.Topic, to.Username, pass, to.CAPEM)
	if err != nil {
		return RemoteChildInfo{}, bodyNames(err)
	}
	defer cl.close()
	tgt := remoteTarget{url: to.URL, topic: to.Topic, user: to.Username}
	refused := func(why string) error {
		return fmt.Errorf("%w: %s; nothing was changed", ErrRemoteRefused, why)
	}
	cluster, err := cl.clusterID(ctx)
	var ae *RemoteAnswerError
	if err != nil && (!errors.As(err, &ae) || ae.Status == http.StatusUnauthorized) {
		return RemoteChildInfo{}, refused(attachRefusal(err, tgt))
	}
	switch {
	case rc.RemoteClusterID == "" || cluster == rc.RemoteClusterID:
	case cluster == "":
		// The topic incarnation alone does not tell the cluster: another cluster's
		// topic of that name, made the same way, has the same one.
		why := "it does not tell its cluster id"
		if err != nil {
			why = "it did not tell its cluster id (" + err.Error() + ")"
		}
		return RemoteChildInfo{}, refused("the remote at " + to.URL + " cannot be told apart from another cluster: " + why +
			", and this child copies to cluster " + rc.RemoteClusterID + "; try again once it answers GET /v1/cluster")
	default:
		return RemoteChildInfo{}, refused("the remote at " + to.URL + " is cluster " + cluster + ", not " + rc.RemoteClusterID +
			", the one this child copies to; to copy to another cluster, attach its topic as a new child")
	}
	if err := cl.produce(ctx, b.remoteProbe(parent, rc.RemoteIncarnation)); err != nil {
		if errors.As(err, &ae) && (ae.Code == string(apigen.ErrorCodeIncarnationMismatch) || ae.Status == http.StatusNotFound) {
			return RemoteChildInfo{}, refused("topic " + to.Topic + " at " + to.URL + " is not the topic this child copies to (" + ae.Error() +
				"): it is another cluster's, or was deleted and created again since the attach; attach it as a new child")
		}
		return RemoteChildInfo{}, refused(attachRefusal(err, tgt))
	}
	sealed, err := b.sealPassword(pass, remoteAAD(to))
	if err != nil {
		return RemoteChildInfo{}, errors.Join(ErrStorage, err)
	}
	if _, err := b.meta.UpdateRemoteChild(rc.ID, to.URL, to.Username, to.CAPEM, sealed, rc.Sealed, u.OwnerID); err != nil {
		return RemoteChildInfo{}, mapMetaErr(err)
	}
	b.log.Info("remote child changed in place", "parent", parent, "child", id, "url", to.URL, "was_url", rc.URL,
		"username", to.Username, "was_username", rc.Username, "ca_changed", to.CAPEM != rc.CAPEM, "password_given", u.Password != nil)
	if err := b.reconcile(false); err != nil {
		b.log.Warn("the remote child's change is committed; opening another topic failed in the same pass", "child", id, "err", err)
	}
	infos, err := b.RemoteChildren(parent)
	if err != nil {
		return RemoteChildInfo{}, err
	}
	for _, ci := range infos {
		if ci.ID == id {
			return ci, nil
		}
	}
	return RemoteChildInfo{}, ErrChildNotFound // detached at once by another request
}

// RemoteChildren lists parent's remote children with their copy's state per partition.
func (b *Broker) RemoteChildren(parent string) ([]RemoteChildInfo, error) {
	pt, err := b.lookup(parent)
	if err != nil {
		return nil, err
	}
	var stats []partitionView
	var out []RemoteChildInfo
	for _, rc := range b.meta.RemoteChildren() {
		if rc.Parent != parent || rc.ParentIncarnation != pt.incarnation {
			continue
		}
		if stats == nil {
			stats = b.partitionViews(pt)
		}
		b.rcMu.Lock()
		c := b.rcopiers[rc.ID]
		b.rcMu.Unlock()
		info := RemoteChildInfo{
			ID: RemoteChildPrefix + strconv.FormatUint(rc.ID, 10), URL: rc.URL, Topic: rc.Topic, Username: rc.Username,
			Incarnation: rc.RemoteIncarnation, ClusterID: rc.RemoteClusterID, Start: rc.Start, State: "running",
		}
		now := partition.WallMillis()
		for i := range pt.parts() {
			l := RemoteLag{Partition: int32(i), Cursor: rc.Cursors[i], ParentNext: stats[i].next}
			if i < len(rc.Expired) {
				l.Expired = rc.Expired[i]
			}
			if stats[i].oldest > l.Cursor {
				l.Expired += stats[i].oldest - l.Cursor // deleted already, counted once the copy passes them
			}
			if p := pt.parts()[i]; p != nil && l.Cursor < l.ParentNext {
				if recs, err := p.Read(l.Cursor, 1); err == nil && len(recs) > 0 {
					l.LagSeconds = max(0, float64(now-recs[0].Timestamp)/1000)
				}
			}
			if c != nil && pt.leads(i) {
				l.State, l.Reason, l.LastError = c.partState(i)
			}
			if why := b.remotePaused(rc); why != "" && pt.leads(i) {
				l.State, l.Reason = "paused", why
			}
			info.Lag = append(info.Lag, l)
		}
		info.State, info.Reason = childState(info.Lag, b.remotePaused(rc))
		out = append(out, info)
	}
	return out, nil
}

// childState sums up the partitions' states: paused, failing when any partition fails,
// running otherwise.
func childState(lag []RemoteLag, paused string) (string, string) {
	if paused != "" {
		return "paused", paused
	}
	for _, l := range lag {
		if l.State == "failing" {
			return "failing", fmt.Sprintf("partition %d: %s", l.Partition, l.Reason)
		}
	}
	return "running", ""
}

type partitionView struct{ oldest, next uint64 }

func (b *Broker) partitionViews(t *topic) []partitionView {
	stats, errs := b.allStats(context.Background(), t)
	out := make([]partitionView, len(t.parts()))
	for i := range out {
		if errs[i] == nil {
			out[i] = partitionView{oldest: stats[i].Oldest, next: stats[i].End}
		}
	}
	return out
}

// remotePaused says why remote child rc must not copy now ("" when it may): paused by
// request, or with security on, the user who attached it may no longer consume the
// parent.
func (b *Broker) remotePaused(rc meta.RemoteChild) string {
	if rc.Paused {
		return "paused by request; POST /v1/topics/" + rc.Parent + "/children/" + RemoteChildPrefix + strconv.FormatUint(rc.ID, 10) + "/resume resumes it where it stopped"
	}
	if rc.OwnerID == 0 {
		return ""
	}
	u, ok := b.meta.UserByID(rc.OwnerID)
	if !ok {
		return "the user who attached (or last changed) this remote child no longer exists; detach it, and attach it again as a user that may consume " + rc.Parent
	}
	if !u.Can(auth.Consume, rc.Parent) {
		return "user " + u.Name + ", who attached (or last changed) this remote child, holds no consume grant on " + rc.Parent + " any more; grant it again to resume the copy, or detach it"
	}
	return ""
}

// reconcileRemoteChildren runs one copier per remote child whose parent this node has
// open, and stops the rest; a running copier is woken to look at the metadata again (a
// pause, a grant).
func (b *Broker) reconcileRemoteChildren() {
	want := b.meta.RemoteChildren()
	b.rcMu.Lock()
	defer b.rcMu.Unlock()
	if b.rcopiers == nil {
		b.rcopiers = make(map[uint64]*remoteCopier)
		go b.resealLoop() // ends with the broker (b.stop)
	}
	live := make(map[uint64]meta.RemoteChild, len(want))
	parents := make(map[uint64]*topic, len(want))
	b.mu.RLock()
	for _, rc := range want {
		if t := b.topics[rc.Parent]; t != nil && t.incarnation == rc.ParentIncarnation {
			live[rc.ID], parents[rc.ID] = rc, t
		}
	}
	b.mu.RUnlock()
	for id, c := range b.rcopiers {
		if _, ok := live[id]; !ok || parents[id] != c.parent {
			c.close()
			delete(b.rcopiers, id)
		}
		if _, ok := live[id]; !ok {
			// Detached (or its parent deleted): its counters go with it, or every
			// attach and detach would leave series behind for the life of the node.
			m, l := b.metrics.RemoteChild, prometheus.Labels{"parent": c.parent.name, "child": c.name}
			m.Copied.DeletePartialMatch(l)
			m.Failures.DeletePartialMatch(l)
			m.Expired.DeletePartialMatch(l)
		}
	}
	for id, rc := range live {
		if c, ok := b.rcopiers[id]; ok {
			c.kicks.broadcast()
			continue
		}
		if c := b.startRemoteCopier(parents[id], rc); c != nil {
			b.rcopiers[id] = c
		}
	}
}

func (b *Broker) stopRemoteCopiers() {
	b.rcMu.Lock()
	defer b.rcMu.Unlock()
	for id, c := range b.rcopiers {
		c.close()
		delete(b.rcopiers, id)
	}
}

// remoteCopier copies the parent partitions this node leads to one remote child: one
// goroutine per partition (held here now or not, as moves change that), each reading a
// batch at its cursor, sending it with
// produce-batch, and moving the cursor through the control plane only once the remote
// answered 202. A crash between the two sends the batch again: duplicates are possible,
// loss is not. A cursor move that fails after the 202 is retried alone: the batch is
// not sent again meanwhile (see unsaved). A failure is retried with backoff while the
// partition is reported failing; the source's own traffic never waits on the copy. It
// copies only while its node's metadata is current, as fan-out does.
type remoteCopier struct {
	b      *Broker
	id     uint64
	name   string // "remote:<id>", the metrics' child label
	parent *topic
	rc     meta.RemoteChild // as attached: of it, only the fields that never change are read (ID, parent, topic)
	tgt    remoteTarget     // guarded by mu: an update in place changes its URL and user
	kicks  signal           // a metadata change (pause, resume, grant, keys) to look at now
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	client    *remoteClient
	sealed    []byte // the sealed password client was made with
	parts     []partState
	logged    string // the child's state and reason last logged
	metricsOn string // the state gauge's current label
}

type partState struct{ state, reason, lastErr string }

func (b *Broker) startRemoteCopier(parent *topic, rc meta.RemoteChild) *remoteCopier {
	ctx, cancel := context.WithCancel(context.Background())
	c := &remoteCopier{
		b: b, id: rc.ID, name: RemoteChildPrefix + strconv.FormatUint(rc.ID, 10), parent: parent, rc: rc,
		tgt: remoteTarget{url: rc.URL, topic: rc.Topic, user: rc.Username,
			credentials: "/v1/topics/" + rc.Parent + "/children/" + RemoteChildPrefix + strconv.FormatUint(rc.ID, 10) + "/credentials"},
		ctx: ctx, cancel: cancel,
		parts: make([]partState, len(parent.parts())),
	}
	// One goroutine per parent partition, held here or not: a move can place one here
	// later, and a held one can be replaced (its group made again); each goroutine
	// copies whatever this node holds and leads of its partition at the time.
	// Every state is set before the first goroutine starts: each reads all of them
	// (set) under c.mu, which this loop does not take.
	for i := range c.parts {
		if i < len(rc.Cursors) {
			c.parts[i].state = "copying"
		}
	}
	for i := range c.parts {
		if i < len(rc.Cursors) {
			c.wg.Add(1)
			go c.run(i)
		}
	}
	return c
}

func (c *remoteCopier) close() {
	c.cancel()
	c.kicks.broadcast()
	c.wg.Wait()
	c.mu.Lock()
	if c.client != nil {
		c.client.close()
	}
	c.mu.Unlock()
	m := c.b.metrics.RemoteChild
	for _, s := range []string{"copying", "paused", "failing"} {
		m.State.DeleteLabelValues(c.parent.name, c.name, s)
	}
	m.Lag.DeleteLabelValues(c.parent.name, c.name)
}

func (c *remoteCopier) partState(i int) (state, reason, lastErr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.parts[i]
	return s.state, s.reason, s.lastErr
}

// set records partition i's state, and on a change of the child's state says so once in
// the log and in the state gauge.
func (c *remoteCopier) set(i int, state, reason string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.parts[i].state, c.parts[i].reason = state, reason
	if err != nil {
		c.parts[i].lastErr = truncate(err.Error(), 500)
	}
	sum, why := "running", ""
	for j, p := range c.parts {
		switch {
		case p.state == "paused":
			sum, why = "paused", p.reason
		case p.state == "failing" && sum != "paused":
			sum, why = "failing", fmt.Sprintf("partition %d: %s", j, p.reason)
		}
	}
	gauge := map[string]string{"running": "copying", "paused": "paused", "failing": "failing"}[sum]
	if gauge != c.metricsOn {
		m := c.b.metrics.RemoteChild
		if c.metricsOn != "" {
			m.State.WithLabelValues(c.parent.name, c.name, c.metricsOn).Set(0)
		}
		m.State.WithLabelValues(c.parent.name, c.name, gauge).Set(1)
		c.metricsOn = gauge
	}
	// One line per change of the child's state: the reason texts are fixed per kind
	// of failure, so a remote that stays down logs once, not once per retry.
	key := sum + "\x00" + why
	if key == c.logged {
		return
	}
	c.logged = key
	log := c.b.log.With("parent", c.parent.name, "child", c.name, "url", c.tgt.url, "topic", c.rc.Topic)
	switch sum {
	case "running":
		log.Info("remote child copying")
	case "paused":
		log.Warn("remote child paused", "reason", why)
	default:
		log.Warn("remote child failing; retrying with backoff", "reason", why, "last_error", c.parts[i].lastErr)
	}
}

// getClient returns the client to the remote, made again from the stored credentials
// whenever they changed (a new password given, or the same sealed again).
func (c *remoteCopier) getClient() (*remoteClient, error) {
	rc, ok := c.b.meta.RemoteChild(c.id)
	if !ok {
		return nil, ErrChildNotFound
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client != nil && bytes.Equal(c.sealed, rc.Sealed) {
		return c.client, nil
	}
	pass, _, err := c.b.openPassword(rc.Sealed, remoteAAD(rc)) // a stale seal is resealLoop's
	if err != nil {
		return nil, err
	}
	cl, err := newRemoteClient(rc.URL, rc.Topic, rc.Username, pass, rc.CAPEM)
	if err != nil {
		return nil, err
	}
	if c.client != nil {
		c.client.close()
	}
	c.client, c.sealed = cl, rc.Sealed
	// The URL and user may have changed with the password (an update in place).
	c.tgt.url, c.tgt.user = rc.URL, rc.Username
	return cl, nil
}

// target is what a failure's reason names: the child's remote as of the last client made.
func (c *remoteCopier) target() remoteTarget {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tgt
}

// credentialsChanged reports whether the stored password is another than the one the
// client was made with: a failure the old one met is worth retrying at once.
func (c *remoteCopier) credentialsChanged(rc meta.RemoteChild) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.client != nil && !bytes.Equal(c.sealed, rc.Sealed)
}

// wait blocks until one of chs fires, the timer (d > 0) does, or the copier stops;
// false when it stopped.
func (c *remoteCopier) wait(d time.Duration, chs ...<-chan struct{}) bool {
	var fire <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		fire = t.C
	}
	var a, b <-chan struct{}
	if len(chs) > 0 {
		a = chs[0]
	}
	if len(chs) > 1 {
		b = chs[1]
	}
	select {
	case <-c.ctx.Done():
		return false
	case <-c.parent.done:
		return false
	case <-fire:
	case <-a:
	case <-b:
	}
	return c.ctx.Err() == nil
}

// expired logs and counts the messages [from, to) of partition i that retention
// deleted before they were copied. Called once the cursor's move past them committed:
// a batch the remote refused is retried, and its retries must not count them again.
func (c *remoteCopier) expired(i int, from, to uint64) {
	c.b.log.Warn("messages were deleted by retention before the remote child copied them; they are never copied",
		"parent", c.parent.name, "child", c.name, "partition", i, "from", from, "to", to, "messages", to-from)
	c.b.metrics.RemoteChild.Expired.WithLabelValues(c.parent.name, c.name).Add(float64(to - from))
}

// backoff waits d before a retry, or less when the child is paused or detached, or
// given new credentials, meanwhile; false when the copier stopped. Kicks come with every metadata change, the
// other partitions' cursor moves included, so a kick alone does not end the wait: a
// failing partition is not retried faster because its neighbours are busy.
func (c *remoteCopier) backoff(d time.Duration) bool {
	until := time.Now().Add(d)
	for {
		left := time.Until(until)
		if left <= 0 {
			return c.ctx.Err() == nil
		}
		if !c.wait(left, c.kicks.wait()) {
			return false
		}
		if rc, ok := c.b.meta.RemoteChild(c.id); !ok || c.b.remotePaused(rc) != "" || c.credentialsChanged(rc) {
			return true
		}
	}
}

func (c *remoteCopier) run(i int) {
	defer c.wg.Done()
	m := c.b.metrics.RemoteChild
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = 200*time.Millisecond, 10*time.Second, 0
	limit := copyBatch
	var buf []byte // the request body, reused batch after batch
	// behind is set while this partition's log ends before the cursor, gapFrom then
	// being the lowest log end seen: see sourceBehind.
	var behind bool
	var gapFrom uint64
	// The partition (and its leadership term) this copy first saw, and the last one
	// whose log end at its start was held against the cursor (see LeadEnd below).
	var firstP, ledP *partition.Partition
	var firstTerm, ledTerm uint64
	looked := false
	fail := func(class, reason string, err error) bool {
		m.Failures.WithLabelValues(c.parent.name, c.name, class).Inc()
		c.set(i, "failing", reason, err)
		return c.backoff(bo.NextBackOff())
	}
	// unsaved is the batch the remote answered 202 for whose cursor move failed: while
	// the cursor stands at its from, only the move is retried. It lives in memory: a
	// restart reads at the cursor and sends the batch once more, as a crash does.
	var unsaved *unsavedBatch
	// stored is what the remote stored of the batch at the cursor (or past it), read
	// from partition p, when it answered that only part of a batch was stored.
	var stored storedPart
	// saved does what follows a cursor move past a batch the remote took.
	saved := func(p *partition.Partition, u unsavedBatch) {
		if u.expired > 0 {
			c.expired(i, u.from, u.first)
		}
		m.Copied.WithLabelValues(c.parent.name, c.name).Add(float64(u.sent))
		m.Lag.WithLabelValues(c.parent.name, c.name).Set(float64(p.Stats().End - u.next))
		bo.Reset()
		c.set(i, "copying", "", nil)
	}
	for {
		wake, kick := c.parent.sig.wait(), c.kicks.wait()
		if c.ctx.Err() != nil {
			return
		}
		// The partition as this node holds it now: a move that places it here, or
		// makes its group again, replaces it in the topic (and wakes the topic's
		// waiters), so it is looked up at each round, not kept.
		p := c.parent.parts()[i]
		if !looked {
			looked, firstP = true, p
			if p != nil {
				firstTerm = p.Term()
			}
		}
		if unsaved != nil && (unsaved.p != p || !p.Leading()) {
			// No longer led here, or replaced: the batch is read again at the cursor
			// (by whichever node leads), for the log may hold other messages there
			// now (a forced takeover), which a move past them would never copy.
			unsaved = nil
		}
		if p == nil || !p.Leading() {
			// Not held here, or a follower replica of a replicated parent: the node
			// leading it copies it. The cursor is in the control plane, so a new
			// leader, here or elsewhere, goes on from it.
			if !c.wait(time.Second, wake, kick) {
				return
			}
			continue
		}
		if !c.b.Ready() {
			// This node's metadata is not current (cut off from the controller, or
			// behind): the child may have been detached, or paused, or its parent
			// deleted, meanwhile. Nothing is copied until it is, as for fan-out.
			if !c.wait(notReadyRetry, kick) {
				return
			}
			continue
		}
		rc, ok := c.b.meta.RemoteChild(c.id)
		if !ok {
			return
		}
		if why := c.b.remotePaused(rc); why != "" {
			c.set(i, "paused", why, nil)
			if !c.wait(0, kick) {
				return
			}
			continue
		}
		from := rc.Cursors[i]
		if term := p.Term(); (term != 0 || !p.Replicated()) && (p != ledP || term != ledTerm) {
			// This partition started leading (or was opened) since the copy last
			// looked. If that happened after the copy first looked (so after the
			// attach set the cursor), everything committed before the start is below
			// the log's end then: a cursor past it means the log went back under the
			// cursor (a forced takeover onto a replica that lacked messages the copy
			// had sent, a restore of an older backup). The log's end now does not
			// tell it once new messages passed the cursor before this look (the child
			// was paused, or producers reached the new leader first): the messages
			// stored below the cursor would go uncopied without a word. (A replica
			// that lost its leadership since the check above is not judged: a later
			// leader may have moved the cursor since.)
			if (p != firstP || term != firstTerm) && p.LeadEnd() < from {
				if !behind || p.LeadEnd() < gapFrom {
					gapFrom = p.LeadEnd()
				}
				behind = true
				m.Failures.WithLabelValues(c.parent.name, c.name, "source_behind").Inc()
			}
			ledP, ledTerm = p, term
		}
		if unsaved != nil && unsaved.from != from {
			// The cursor moved: the failed move committed after all (to the batch's
			// end: what follows a saved batch is done now, the partition reported
			// copying again), or another node's.
			if from == unsaved.next {
				saved(p, *unsaved)
			}
			unsaved = nil
		}
		if unsaved != nil {
			// The remote holds this batch: save the cursor past it, and send nothing
			// (the next batch waits for the move).
			u := *unsaved
			err := c.b.meta.MoveRemoteCursor(c.id, int32(i), u.from, u.next, u.expired)
			switch {
			case err == nil:
				unsaved = nil
				saved(p, u)
			case isConflict(err):
				// The cursor is not at from on the controller: it moved (the move
				// that seemed to fail committed, or another node's) and this node
				// has not applied it yet. Read at it once it did.
				if !c.wait(notReadyRetry, kick) {
					return
				}
			default:
				if !fail("control_plane", cursorNotSaved, err) {
					return
				}
			}
			continue
		}
		recs, err := p.Read(from, limit)
		if errors.Is(err, partition.ErrClosed) {
			// Replaced meanwhile (read again from the one held now), or the whole
			// topic closed (the wait ends the copy).
			if !c.wait(100*time.Millisecond, wake, kick) {
				return
			}
			continue
		}
		if errors.Is(err, partition.ErrCorrupt) && len(recs) == 0 && p.Stats().Oldest > from {
			o := p.Stats().Oldest
			// The read started at the oldest message held, which is damaged: retention
			// deleted the ones from the cursor on. They expired (counted once, as below
			// when nothing is left); the damaged one is dealt with at the next round.
			// Skipped one offset at a time from the cursor, each was a control-plane
			// commit and an error line for a damaged message it was not.
			err := c.b.meta.MoveRemoteCursor(c.id, int32(i), from, o, o-from)
			if err == nil {
				c.expired(i, from, o)
			} else if !isConflict(err) {
				if !fail("control_plane", "the cursor could not be saved through the control plane; retrying", err) {
					return
				}
			}
			continue
		}
		if errors.Is(err, partition.ErrCorrupt) && len(recs) == 0 && c.parent.damagedOnReplica(i) {
			// Damaged on this replica only: the others hold it intact. This one hands
			// its leadership over and is rebuilt; the next leader copies it.
			if !fail("source_read", "a message of this partition is damaged on the node leading it; that node hands its leadership to a replica with an intact copy, which copies it", err) {
				return
			}
			continue
		}
		if errors.Is(err, partition.ErrCorrupt) && len(recs) == 0 {
			// Damaged at from: it can never be copied, and retrying would stop this
			// partition's copy for good. Skip it, counted and logged, as fan-out does.
			c.b.log.Error("a damaged message is skipped by a remote child: it is never copied", "topic", c.parent.name,
				"partition", i, "offset", from, "child", c.name, "err", err)
			c.b.metrics.Damaged.WithLabelValues(c.parent.name, "remote_child").Inc()
			if err := c.b.meta.MoveRemoteCursor(c.id, int32(i), from, from+1, 0); err != nil && !isConflict(err) {
				if !fail("control_plane", "the cursor could not be saved through the control plane; retrying", err) {
					return
				}
			}
			continue
		}
		if err != nil {
			if !fail("source_read", "reading this topic's partition failed; retrying", err) {
				return
			}
			continue
		}
		if len(recs) == 0 {
			st := p.Stats()
			if from > st.End {
				// A partition that leads holds every committed message, so its log went
				// back: see sourceBehind.
				if !behind || st.End < gapFrom {
					gapFrom = st.End
				}
				behind = true
				if !fail("source_behind", sourceBehind, fmt.Errorf("this partition's log ends at offset %d and the copy's cursor is at %d", st.End, from)) {
					return
				}
				continue
			}
			if o := st.Oldest; o > from {
				// Retention deleted everything from the cursor on: nothing to send, but
				// the loss is counted and the cursor moves past it.
				err := c.b.meta.MoveRemoteCursor(c.id, int32(i), from, o, o-from)
				if err == nil {
					c.expired(i, from, o)
				} else if !isConflict(err) {
					if !fail("control_plane", "the cursor could not be saved through the control plane; retrying", err) {
						return
					}
				}
				continue
			}
			c.set(i, "copying", "", nil)
			m.Lag.WithLabelValues(c.parent.name, c.name).Set(0)
			if !c.wait(0, wake, kick) {
				return
			}
			continue
		}
		if behind {
			behind = false
			c.b.log.Error("messages stored after this partition's log went back are never copied by the remote child: the cursor was past them",
				"parent", c.parent.name, "child", c.name, "partition", i, "from", gapFrom, "to", from, "messages", from-gapFrom)
			c.set(i, "failing", sourceBehind, fmt.Errorf("messages at offsets %d to %d were stored after this partition's log went back, below the copy's cursor, and are never copied", gapFrom, from-1))
		}
		cl, err := c.getClient()
		if err != nil {
			if !fail("credentials", "the stored password cannot be opened with this node's keys (the cluster secret it was sealed under is gone); detach and attach again with the password", err) {
				return
			}
			continue
		}
		// Messages retention deleted before they were copied are counted (and logged)
		// once the cursor moved past them, not at every retry of the batch after them.
		var expired uint64
		if recs[0].Offset > from {
			expired = recs[0].Offset - from
		}
		// What an earlier try of this batch stored at the remote (a partly stored
		// answer) is not sent again.
		if stored.p != p || stored.from != from {
			stored = storedPart{p: p, from: from}
		}
		send := recs
		if len(stored.offsets) > 0 {
			send = make([]segment.Record, 0, len(recs))
			for _, r := range recs {
				if !stored.offsets[r.Offset] {
					send = append(send, r)
				}
			}
		}
		body, sent := c.batch(buf[:0], i, send)
		buf = body
		if sent > 0 {
			err := cl.produceBody(c.ctx, body)
			var ae *RemoteAnswerError
			if errors.As(err, &ae) && ae.Status == http.StatusRequestEntityTooLarge && len(recs) > 1 {
				limit = max(1, len(recs)/2) // over the remote's body limit: smaller batches
				continue
			}
			if err != nil {
				if c.ctx.Err() != nil {
					return
				}
				if ae != nil && ae.PartlyStored {
					// The remote stored the messages of its partitions that are not
					// in Failed: sending the whole batch again stored them once more
					// at every retry, for as long as a remote partition failed. Only
					// the others are sent again (those whose remote partition is not
					// known here are sent again too).
					failed := make(map[int]bool, len(ae.Failed))
					for _, f := range ae.Failed {
						failed[int(f)] = true
					}
					for _, r := range send {
						if rp := c.remotePartition(i, r); r.Attrs&AttrRemoteCopy == 0 && rp >= 0 && !failed[rp] {
							if stored.offsets == nil {
								stored.offsets = make(map[uint64]bool)
							}
							stored.offsets[r.Offset] = true
						}
					}
				}
				if ae == nil && len(recs) > 1 && !dialFailed(err) {
					// Sent, and no answer (timed out, or the connection was cut): the
					// link or the remote may not carry a batch this large within the
					// request's bound. The same batch again would fail the same way
					// for good (and each try the remote stored after all is one more
					// copy of it); smaller ones may pass. They grow back after each
					// batch the remote takes.
					limit = max(1, len(recs)/2)
				}
				class, reason := remoteFailure(err, c.target())
				if !fail(class, reason, err) {
					return
				}
				continue
			}
		}
		for _, r := range recs {
			if stored.offsets[r.Offset] {
				sent++ // taken by an earlier, partly stored try
			}
		}
		u := unsavedBatch{p: p, from: from, next: recs[len(recs)-1].Offset + 1, first: recs[0].Offset, expired: expired, sent: sent}
		// What a partly stored try took past this batch (this one is shorter: halved
		// after a try that got no answer) is still not sent again by the next batch,
		// read at this one's end. Forgotten, it was sent again: duplicates no crash or
		// lost answer of theirs caused (an adversarial review, 6 December).
		rest := storedPart{p: p, from: u.next}
		for o := range stored.offsets {
			if o >= u.next {
				if rest.offsets == nil {
					rest.offsets = make(map[uint64]bool)
				}
				rest.offsets[o] = true
			}
		}
		stored = rest
		if err := c.b.meta.MoveRemoteCursor(c.id, int32(i), from, u.next, expired); err != nil {
			if isConflict(err) {
				continue // moved meanwhile (a detach and re-attach, another node): read it again
			}
			// The batch is at the remote but the cursor did not move: the retries save
			// it, and send nothing, until it moves. Sending the batch again at every
			// retry stored it once per retry for as long as the control plane could not
			// be reached (every 5 s, up to 1,000 messages each time).
			unsaved = &u
			if !fail("control_plane", cursorNotSaved, err) {
				return
			}
			continue
		}
		saved(p, u)
		if len(recs) < limit {
			// Caught up: let the next batch gather for a moment. Every batch costs a
			// request, a sync on the remote and a control-plane commit here, so a
			// trickle of small produces is sent in fewer, larger batches.
			if !c.wait(copyLinger) {
				return
			}
		}
		limit = min(copyBatch, limit*2)
	}
}

// dialFailed reports whether err is a failure to connect to the remote: nothing of the
// batch was sent, so its size was not the cause.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// sourceBehind is the reason of a partition whose log ends before the copy's cursor:
// the parent lost messages the copy had already sent (a forced takeover of a partition
// that lost its quorum, or a restore of an older backup), and the offsets from its log
// end up to the cursor will be given to new messages. The cursor never moves back, so
// those new messages are never copied; the copy goes on from the cursor once the log
// reaches it, and logs (and keeps in last_error) which offsets were not copied.
const sourceBehind = "this topic's partition lost messages the copy had sent (a forced takeover, or a restore of an older backup): its log ends before the copy's cursor, and the messages stored below the cursor from now on are not copied; detach this child and attach it again (start earliest copies what the topic holds, some messages again)"

// unsavedBatch is a batch of partition p, offsets from up to next, that the remote
// answered 202 for; first is its first record's offset (the ones below it, from on,
// expired), sent how many messages it sent.
type unsavedBatch struct {
	p                          *partition.Partition
	from, next, first, expired uint64
	sent                       int
}

// storedPart is what the remote stored of the batch at cursor from of partition p by
// partly stored answers: the offsets of the messages it took.
type storedPart struct {
	p       *partition.Partition
	from    uint64
	offsets map[uint64]bool
}

// cursorNotSaved is the reason of a partition whose batch the remote took but whose
// cursor could not be moved past it.
const cursorNotSaved = "the cursor could not be saved through the control plane; the save is retried, and the batch the remote took is not sent again meanwhile"

// copyLinger is how long a remote child's copy of a partition that caught up waits
// before it sends again: the copy's added lag, for fewer and larger batches.
const copyLinger = 10 * time.Millisecond

func isConflict(err error) bool {
	var ce *ConflictError
	return errors.As(err, &ce)
}

// RemoteChildMetrics are the remote children's metrics, labelled by parent topic and
// child id (remote:<n>).
type RemoteChildMetrics struct {
	Copied   *prometheus.CounterVec
	Failures *prometheus.CounterVec
	Expired  *prometheus.CounterVec
	State    *prometheus.GaugeVec
	Lag      *prometheus.GaugeVec
}

func newRemoteChildMetrics(r *prometheus.Registry) *RemoteChildMetrics {
	m := &RemoteChildMetrics{
		Copied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_remote_child_copied_total", Help: "Messages a remote child's copy delivered to the remote cluster (answered 202), by parent and child.",
		}, []string{"parent", "child"}),
		Failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_remote_child_failures_total", Help: "Failed attempts of a remote child's copy, by kind (unreachable, unauthenticated, forbidden, remote_recreated, remote_topic_missing, remote_unavailable, refused, too_large, credentials, control_plane, source_read, source_behind); each is retried with backoff.",
		}, []string{"parent", "child", "reason"}),
		Expired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narad_remote_child_expired_total", Help: "Messages retention deleted from the parent before a remote child copied them: they are never copied.",
		}, []string{"parent", "child"}),
		State: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "narad_remote_child_state", Help: "1 for a remote child's current state on this node (copying, paused, failing).",
		}, []string{"parent", "child", "state"}),
		Lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "narad_remote_child_lag_messages", Help: "Messages of the partition last copied that wait to be copied, as of the last batch.",
		}, []string{"parent", "child"}),
	}
	r.MustRegister(m.Copied, m.Failures, m.Expired, m.State, m.Lag)
	return m
}
