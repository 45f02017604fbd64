package httpapi

import (
	"context"
	"net/http"
	"testing"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/auth"
)

// passwordBroker stores passwords in fakeUsers; after each SetPassword it runs then,
// standing for a change through another node (or another request) applied right after
// this one. Only User and SetPassword are called; the embedded nil Broker panics on
// anything else.
type passwordBroker struct {
	Broker
	users *fakeUsers
	then  func()
}

func (b *passwordBroker) User(name string) (auth.User, bool) { return b.users.get(name) }

func (b *passwordBroker) SetPassword(_ context.Context, name, pw string) error {
	h, err := auth.HashPassword(pw)
	if err != nil {
		return err
	}
	b.users.mu.Lock()
	u := b.users.users[name]
	u.Hash = h
	b.users.users[name] = u
	b.users.mu.Unlock()
	if b.then != nil {
		b.then()
	}
	return nil
}

// TestPasswordSetThenChangedAgainNotRemembered: the password route remembers the
// password it set as a login that passed; when another change lands between the
// route's write and that memory (two changes racing, through two nodes or two
// requests), the password the route set is no longer the user's and must not log in.
// Before, the route remembered its password with whatever hash was stored by then, and
// the replaced password logged in without a bcrypt for 2 minutes.
func TestPasswordSetThenChangedAgainNotRemembered(t *testing.T) {
	t.Parallel()
	users := newFakeUsers(t, "admin", "admin-password", "bob", "bob-password-0")
	admin, _ := users.get("admin")
	admin.Grants = []auth.Grant{{Action: auth.Admin, Topics: []string{"*"}}}
	users.users["admin"] = admin
	fb := &passwordBroker{users: users}
	h := &handlers{b: fb, authn: newAuthenticator(fb.User, 0, quietLogger(), nil)}
	fb.then = func() {
		fb.then = nil
		if err := fb.SetPassword(context.Background(), "bob", "bob-password-2"); err != nil {
			t.Error(err)
		}
	}
	ctx := context.WithValue(context.Background(), principalKey{}, &admin)
	if _, err := h.ChangePassword(ctx, apigen.ChangePasswordRequestObject{Username: "bob",
		Body: &apigen.ChangePasswordJSONRequestBody{NewPassword: "bob-password-1"}}); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := statusOf(mustFail(h.authn.authenticate(loginRequest("10.0.0.1:1", "bob", "bob-password-1")))); st != http.StatusUnauthorized {
		t.Fatalf("the password replaced by a later change logs in: %d, want 401", st)
	}
	if _, err := h.authn.authenticate(loginRequest("10.0.0.1:1", "bob", "bob-password-2")); err != nil {
		t.Fatalf("the current password: %v", err)
	}
	// Without a race, the password set is remembered: its next login needs no bcrypt.
	if _, err := h.ChangePassword(ctx, apigen.ChangePasswordRequestObject{Username: "bob",
		Body: &apigen.ChangePasswordJSONRequestBody{NewPassword: "bob-password-3"}}); err != nil {
		t.Fatal(err)
	}
	u, _ := users.get("bob")
	h.authn.mu.Lock()
	e, hit := h.authn.cache["bob"]
	h.authn.mu.Unlock()
	if !hit || string(e.storedHash) != string(u.Hash) || e.digest != h.authn.digest("bob", "bob-password-3") {
		t.Fatalf("the password set without a race is not remembered")
	}
}
