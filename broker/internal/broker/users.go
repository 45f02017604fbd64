package broker

import (
	"context"
	"errors"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/meta"
)

// ErrUserNotFound means no user of that name exists.
var ErrUserNotFound = errors.New("user not found")

// ErrUserExists means a user of that name exists already.
var ErrUserExists = errors.New("user exists")

func mapUserErr(err error) error {
	switch {
	case errors.Is(err, meta.ErrLastAdmin):
		return &ConflictError{Msg: "this is the last user holding admin on *: without one, nobody could manage users; give another user admin on * first"}
	case errors.Is(err, meta.ErrUserExists):
		return ErrUserExists
	case errors.Is(err, meta.ErrUserNotFound):
		return ErrUserNotFound
	}
	return mapMetaErr(err)
}

func authInvalid(err error) error {
	if errors.Is(err, auth.ErrInvalid) {
		return invalid(apigen.ErrorCodeBadRequest, "%s", err.Error())
	}
	return err
}

// User returns a user as this node knows it.
func (b *Broker) User(name string) (auth.User, bool) { return b.meta.User(name) }

// Users lists every user.
func (b *Broker) Users() ([]auth.User, error) {
	if err := b.ensureReady(); err != nil {
		return nil, err
	}
	return b.meta.Users(), nil
}

// CreateUser stores a user with a bcrypt hash of password. Authorization (who may grant
// what) is the caller's business.
func (b *Broker) CreateUser(ctx context.Context, name, password string, grants []auth.Grant) (auth.User, error) {
	if err := b.ensureReady(); err != nil {
		return auth.User{}, err
	}
	if err := auth.CheckUsername(name); err != nil {
		// invalid_name, as the API lists it for a user name as for a topic name.
		return auth.User{}, invalid(apigen.ErrorCodeInvalidName, "username %q is invalid: %s", truncate(name, 64), UsernameRule)
	}
	if err := errors.Join(auth.CheckPassword(password), auth.CheckGrants(grants, ValidTopicName)); err != nil {
		return auth.User{}, authInvalid(err)
	}
	hash, err := auth.HashPassword(password)
	if err != nil {
		return auth.User{}, err
	}
	if grants == nil {
		grants = []auth.Grant{}
	}
	u, err := b.meta.CreateUser(auth.User{Name: name, Hash: hash, Grants: grants}, false)
	return u, mapUserErr(err)
}

// DeleteUser removes a user.
func (b *Broker) DeleteUser(ctx context.Context, name string) error {
	if err := b.ensureReady(); err != nil {
		return err
	}
	_, err := b.meta.DeleteUser(name)
	return mapUserErr(err)
}

// SetGrants replaces a user's grants.
func (b *Broker) SetGrants(ctx context.Context, name string, grants []auth.Grant) (auth.User, error) {
	if err := b.ensureReady(); err != nil {
		return auth.User{}, err
	}
	if err := auth.CheckGrants(grants, ValidTopicName); err != nil {
		return auth.User{}, authInvalid(err)
	}
	u, err := b.meta.SetGrants(name, grants)
	return u, mapUserErr(err)
}

// SetPassword replaces a user's password.
func (b *Broker) SetPassword(ctx context.Context, name, password string) error {
	if err := b.ensureReady(); err != nil {
		return err
	}
	if err := auth.CheckPassword(password); err != nil {
		return authInvalid(err)
	}
	hash, err := auth.HashPassword(password)
	if err != nil {
		return err
	}
	_, err = b.meta.SetPassword(name, hash)
	return mapUserErr(err)
}

// SeedAdmin creates the root user "admin" with every right, once in the cluster's life:
// later calls (every restart with --admin-password) change nothing, except as a break-
// glass: while no user holds admin on * (a data directory from a version that let the
// last admin be deleted or demoted), "admin" gets this password and admin on * again.
func (b *Broker) SeedAdmin(password string) (created bool, err error) {
	if err := auth.CheckPassword(password); err != nil {
		return false, authInvalid(err)
	}
	hash, err := auth.HashPassword(password)
	if err != nil {
		return false, err
	}
	root := auth.User{Name: "admin", Hash: hash, Grants: []auth.Grant{{Action: auth.Admin, Topics: []string{"*"}}}}
	_, err = b.meta.CreateUser(root, true)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, meta.ErrUserExists) {
		return false, mapUserErr(err)
	}
	if b.meta.HasAdmin() {
		return false, nil
	}
	u, err := b.meta.RestoreAdmin(root)
	if errors.Is(err, meta.ErrUserExists) {
		return false, nil // an admin appeared meanwhile
	}
	if err != nil {
		return false, mapUserErr(err)
	}
	b.log.Warn("no user held admin on *: gave user "+u.Name+" admin on * and the password from NARAD_ADMIN_PASSWORD (--admin-password); change it with PUT /v1/users/"+u.Name+"/password", "user", u.Name)
	return true, nil
}
