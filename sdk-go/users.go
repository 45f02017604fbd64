package narad

import (
	"context"
	"net/http"

	"github.com/narad-mq/narad/sdk-go/api"
)

// Grant allows one action on a set of topics.
type Grant struct {
	// Action is "produce", "consume", "create" or "admin".
	Action string
	// Topics are exact names or prefix wildcards ("invoices.*").
	Topics []string
}

// User is a broker user with its grants (never its password).
type User struct {
	Name   string
	Grants []Grant
}

func grantsWire(gs []Grant) []api.Grant {
	out := make([]api.Grant, len(gs))
	for i, g := range gs {
		out[i] = api.Grant{Action: api.GrantAction(g.Action), Topics: g.Topics}
	}
	return out
}

func userOf(u api.User) User {
	out := User{Name: u.Username, Grants: make([]Grant, len(u.Grants))}
	for i, g := range u.Grants {
		out.Grants[i] = Grant{Action: string(g.Action), Topics: g.Topics}
	}
	return out
}

// CreateUser creates a user with grants (admin only; nobody may grant more than they
// hold). On a broker without users, the first one turns security on.
func (c *Client) CreateUser(ctx context.Context, name, password string, grants []Grant) (*User, error) {
	req := api.CreateUserRequest{Username: name, Password: password}
	if grants != nil {
		g := grantsWire(grants)
		req.Grants = &g
	}
	var out api.User
	if err := c.doJSON(ctx, &call{op: "create-user",
		build: func(s string) (*http.Request, error) { return api.NewCreateUserRequest(s, req) }}, &out); err != nil {
		return nil, err
	}
	u := userOf(out)
	return &u, nil
}

// Users lists the users.
func (c *Client) Users(ctx context.Context) ([]User, error) {
	var out api.UserList
	if err := c.doJSON(ctx, &call{op: "list-users", build: api.NewListUsersRequest}, &out); err != nil {
		return nil, err
	}
	us := make([]User, len(out.Users))
	for i, u := range out.Users {
		us[i] = userOf(u)
	}
	return us, nil
}

// User returns one user.
func (c *Client) User(ctx context.Context, name string) (*User, error) {
	var out api.User
	if err := c.doJSON(ctx, &call{op: "get-user",
		build: func(s string) (*http.Request, error) { return api.NewGetUserRequest(s, name) }}, &out); err != nil {
		return nil, err
	}
	u := userOf(out)
	return &u, nil
}

// DeleteUser deletes a user.
func (c *Client) DeleteUser(ctx context.Context, name string) error {
	return c.doJSON(ctx, &call{op: "delete-user",
		build: func(s string) (*http.Request, error) { return api.NewDeleteUserRequest(s, name) }}, nil)
}

// ReplaceGrants sets a user's grants to exactly grants and returns the user.
func (c *Client) ReplaceGrants(ctx context.Context, name string, grants []Grant) (*User, error) {
	req := api.ReplaceGrantsRequest{Grants: grantsWire(grants)}
	var out api.User
	if err := c.doJSON(ctx, &call{op: "replace-grants",
		build: func(s string) (*http.Request, error) { return api.NewReplaceGrantsRequest(s, name, req) }}, &out); err != nil {
		return nil, err
	}
	u := userOf(out)
	return &u, nil
}

// ChangePassword changes a user's password. A user changing their own passes current;
// an admin resetting anyone's passes "".
func (c *Client) ChangePassword(ctx context.Context, name, current, next string) error {
	req := api.ChangePasswordRequest{NewPassword: next}
	if current != "" {
		req.CurrentPassword = &current
	}
	return c.doJSON(ctx, &call{op: "change-password",
		build: func(s string) (*http.Request, error) { return api.NewChangePasswordRequest(s, name, req) }}, nil)
}
