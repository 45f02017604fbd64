package httpapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/auth"
)

// behindBroker is a clustered node whose metadata is behind: users holds what it has
// applied, committed what the controller has committed; CatchUp applies the rest.
// Only User, Clustered and CatchUp are called (the embedded nil Broker panics on
// anything else).
type behindBroker struct {
	Broker
	users, committed *fakeUsers
	catchUps         atomic.Int32
}

func (b *behindBroker) User(name string) (auth.User, bool) { return b.users.get(name) }
func (b *behindBroker) Clustered() bool                    { return true }
func (b *behindBroker) CatchUp(context.Context) error {
	b.catchUps.Add(1)
	b.committed.mu.Lock()
	defer b.committed.mu.Unlock()
	b.users.mu.Lock()
	defer b.users.mu.Unlock()
	b.users.users = map[string]auth.User{}
	for k, v := range b.committed.users {
		b.users.users[k] = v
	}
	return nil
}

// TestAdminWritesDecidedOnACurrentView: an admin demoted through another node a moment
// ago, reaching a node that has not applied the demotion yet, is refused the writes
// that manage users (here: creating another admin, a way to keep the rights just
// taken away, and resetting the remaining admin's password): the node catches up with
// the controller before it decides on a write to the metadata. Before, it decided on
// its stale view and let both through. A data request (produce) is still decided on
// the node's view without a round trip.
func TestAdminWritesDecidedOnACurrentView(t *testing.T) {
	t.Parallel()
	admin := []auth.Grant{{Action: auth.Admin, Topics: []string{"*"}}}
	stale := newFakeUsers(t, "root", "root-password", "mallory", "mallory-password")
	for _, n := range []string{"root", "mallory"} {
		u := stale.users[n]
		u.ID, u.Grants = uint64(len(n)), admin
		stale.users[n] = u
	}
	committed := &fakeUsers{users: map[string]auth.User{}}
	for k, v := range stale.users {
		committed.users[k] = v
	}
	demoted := committed.users["mallory"]
	demoted.Grants = []auth.Grant{{Action: auth.Produce, Topics: []string{"logs"}}}
	committed.users["mallory"] = demoted
	fb := &behindBroker{users: stale, committed: committed}
	h := &handlers{b: fb, authn: newAuthenticator(fb.User, 0, quietLogger(), nil)}

	run := func(req any) (called bool, err error) {
		u, _ := fb.users.get("mallory") // as authentication found her, on the stale view
		ctx := context.WithValue(context.Background(), principalKey{}, &u)
		r := httptest.NewRequest(http.MethodPost, "/v1/users", nil).WithContext(ctx)
		next := func(ctx context.Context, w http.ResponseWriter, r *http.Request, req any) (any, error) {
			called = true
			return nil, nil
		}
		_, err = h.authorize(next, "op")(ctx, httptest.NewRecorder(), r, req)
		return called, err
	}
	grants := []apigen.Grant{{Action: apigen.GrantAction(auth.Admin), Topics: []string{"*"}}}
	called, err := run(apigen.CreateUserRequestObject{Body: &apigen.CreateUserJSONRequestBody{Username: "backdoor", Password: "backdoor-pw", Grants: &grants}})
	if st, _, _ := statusOf(err); called || st != http.StatusForbidden {
		t.Fatalf("a demoted admin creating an admin on a node behind: handler ran %v, status %d; want refused with 403", called, st)
	}
	called, err = run(apigen.ChangePasswordRequestObject{Username: "root", Body: &apigen.ChangePasswordJSONRequestBody{NewPassword: "taken-over"}})
	if st, _, _ := statusOf(err); called || st != http.StatusForbidden {
		t.Fatalf("a demoted admin resetting root's password on a node behind: handler ran %v, status %d; want refused with 403", called, st)
	}
	// A write by a user deleted meanwhile: 401, the credentials no longer name a user.
	fb.committed.mu.Lock()
	delete(fb.committed.users, "mallory")
	fb.committed.mu.Unlock()
	fb.users.mu.Lock()
	fb.users.users["mallory"] = stale.users["root"] // the stale view: still an admin
	m := fb.users.users["mallory"]
	m.Name = "mallory"
	fb.users.users["mallory"] = m
	fb.users.mu.Unlock()
	called, err = run(apigen.DeleteUserRequestObject{Username: "root"})
	if st, _, _ := statusOf(err); called || st != http.StatusUnauthorized {
		t.Fatalf("a deleted admin deleting root on a node behind: handler ran %v, status %d; want refused with 401", called, st)
	}
	// Reads and data requests are decided on the node's view, with no catch-up.
	before := fb.catchUps.Load()
	fb.users.mu.Lock()
	fb.users.users["mallory"] = m
	fb.users.mu.Unlock()
	if called, err := run(apigen.ListUsersRequestObject{}); !called || err != nil {
		t.Fatalf("listing users: handler ran %v, err %v", called, err)
	}
	if n := fb.catchUps.Load(); n != before {
		t.Fatalf("%d catch-ups for a read, want none", n-before)
	}
}
