package httpapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/auth"
)

func userJSON(u auth.User) apigen.User {
	return apigen.User{Username: u.Name, Grants: fromGrants(u.Grants)}
}

// securityOff refuses user management on a node without security: a user created there
// would lock everyone out at the next start (security turns on once users exist) with
// no admin to let them back in.
func securityOff(ctx context.Context) error {
	if principal(ctx) != nil {
		return nil
	}
	return newErr(http.StatusConflict, apigen.ErrorCodeConflict, "security is off on this node: start it with NARAD_ADMIN_PASSWORD to manage users")
}

func (h *handlers) CreateUser(ctx context.Context, r apigen.CreateUserRequestObject) (apigen.CreateUserResponseObject, error) {
	if err := securityOff(ctx); err != nil {
		return nil, err
	}
	var grants []auth.Grant
	if r.Body.Grants != nil {
		grants = toGrants(*r.Body.Grants)
	}
	u, err := h.b.CreateUser(ctx, r.Body.Username, r.Body.Password, grants)
	if err != nil {
		return nil, err
	}
	return apigen.CreateUser201JSONResponse(userJSON(u)), nil
}

func (h *handlers) ListUsers(ctx context.Context, _ apigen.ListUsersRequestObject) (apigen.ListUsersResponseObject, error) {
	us, err := h.b.Users()
	if err != nil {
		return nil, err
	}
	out := apigen.ListUsers200JSONResponse{Users: make([]apigen.User, len(us))}
	for i, u := range us {
		out.Users[i] = userJSON(u)
	}
	return out, nil
}

func (h *handlers) GetUser(ctx context.Context, r apigen.GetUserRequestObject) (apigen.GetUserResponseObject, error) {
	u, ok := h.b.User(r.Username)
	if !ok {
		return nil, errUserNotFound()
	}
	return apigen.GetUser200JSONResponse(userJSON(u)), nil
}

func errUserNotFound() *apiError {
	return newErr(http.StatusNotFound, apigen.ErrorCodeUserNotFound, "no such user; list users with GET /v1/users")
}

func (h *handlers) DeleteUser(ctx context.Context, r apigen.DeleteUserRequestObject) (apigen.DeleteUserResponseObject, error) {
	if err := securityOff(ctx); err != nil {
		return nil, err
	}
	if err := h.b.DeleteUser(ctx, r.Username); err != nil {
		return nil, err
	}
	return apigen.DeleteUser204Response{}, nil
}

func (h *handlers) ReplaceGrants(ctx context.Context, r apigen.ReplaceGrantsRequestObject) (apigen.ReplaceGrantsResponseObject, error) {
	if err := securityOff(ctx); err != nil {
		return nil, err
	}
	u, err := h.b.SetGrants(ctx, r.Username, toGrants(r.Body.Grants))
	if err != nil {
		return nil, err
	}
	return apigen.ReplaceGrants200JSONResponse(userJSON(u)), nil
}

// proveCurrentPassword makes a user who changes their own password prove the current
// one; an admin resets anyone's without it. The proof is a password check like a login:
// it goes through the authenticator's bounds, delay and failure count, so the route is
// no cheaper way to guess passwords or to spend the node's CPU on bcrypt.
func (h *handlers) proveCurrentPassword(r *http.Request, actor *auth.User, req apigen.ChangePasswordRequestObject) error {
	if actor.IsAdmin() || req.Body == nil {
		return nil
	}
	if req.Body.CurrentPassword == nil {
		return newErr(http.StatusBadRequest, apigen.ErrorCodeBadRequest, "current_password is required to change your own password")
	}
	cur := *req.Body.CurrentPassword
	if len(cur) > auth.MaxPasswordBytes {
		return h.authn.failForbidden(r, req.Username)
	}
	_, err := h.authn.check(r, req.Username, cur)
	if errors.Is(err, errWrongPassword) {
		return h.authn.failForbidden(r, req.Username)
	}
	return err
}

// ChangePassword sets a user's password; authorize has checked who may, and the
// current password when it is needed.
func (h *handlers) ChangePassword(ctx context.Context, r apigen.ChangePasswordRequestObject) (apigen.ChangePasswordResponseObject, error) {
	if err := securityOff(ctx); err != nil {
		return nil, err
	}
	if _, ok := h.b.User(r.Username); !ok {
		return nil, errUserNotFound()
	}
	if err := h.b.SetPassword(ctx, r.Username, r.Body.NewPassword); err != nil {
		return nil, err
	}
	// The new password is known good: its first logins need no bcrypt, and later ones
	// go ahead of unproven attempts.
	if h.authn != nil {
		h.authn.rememberSet(ctx, r.Username, r.Body.NewPassword)
	}
	return apigen.ChangePassword204Response{}, nil
}
