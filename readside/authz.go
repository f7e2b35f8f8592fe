package readside

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/repeatrate/repeatrate/internal/auth"
)

// tokenCookie carries a token set by the login form, for pages read by a browser without
// JavaScript (which cannot send an Authorization header). HttpOnly and SameSite=Strict.
const tokenCookie = "repeatrate_token"

// principal is the request's token holder: from the Authorization header, else the login cookie;
// nil without a known token.
func (a *api) principal(req *http.Request) *auth.Principal {
	if tok := auth.Bearer(req); tok != "" {
		return a.cfg.Tokens.Lookup(tok)
	}
	if c, err := req.Cookie(tokenCookie); err == nil {
		return a.cfg.Tokens.Lookup(c.Value)
	}
	return nil
}

// allow answers 401 without a known token and 403 when the token may not read ws, and reports
// whether the request may go on. Both answers are the same whatever ws holds, or whether it
// exists: they tell nothing about other tenants.
func (a *api) allow(w http.ResponseWriter, req *http.Request, ws string, badge bool) bool {
	p := a.principal(req)
	if p == nil {
		a.metrics.denied.WithLabelValues("401").Inc()
		w.Header().Set("WWW-Authenticate", `Bearer realm="repeatrate"`)
		writeError(w, http.StatusUnauthorized, "a bearer token is required (Authorization: Bearer <token>)", badge)
		return false
	}
	if !p.Can(ws, auth.Read) {
		a.metrics.denied.WithLabelValues("403").Inc()
		writeError(w, http.StatusForbidden, "this token may not read the workspace", badge)
		return false
	}
	return true
}

// sameOrigin refuses the forms' posts from another site (Sec-Fetch-Site, else Origin against
// Host): a login CSRF would sign a visitor in with the attacker's token, so that they read and
// trust its pages; a cross-site logout would sign them out. Requests without either header (not
// from a browser, or a browser older than 2023) pass.
var sameOrigin = http.NewCrossOriginProtection()

// overHTTPS reports whether the browser reached the server over HTTPS: directly, through a
// TLS-terminating proxy (X-Forwarded-Proto), or as its Origin says. Each only ever adds the
// cookie's Secure flag, so a forged header costs its sender nothing but their own cookie.
func overHTTPS(req *http.Request) bool {
	return req.TLS != nil || strings.EqualFold(req.Header.Get("X-Forwarded-Proto"), "https") ||
		strings.HasPrefix(req.Header.Get("Origin"), "https://")
}

// crossSite answers 403 to a cross-site post of a form and reports whether it did.
func (a *api) crossSite(w http.ResponseWriter, req *http.Request) bool {
	if err := sameOrigin.Check(req); err != nil {
		a.metrics.denied.WithLabelValues("403").Inc()
		a.renderPage(w, http.StatusForbidden, "error", pageData{Title: "Forbidden", Error: "this form may only be posted from this site's own pages"})
		return true
	}
	return false
}

// login sets the token cookie from a posted form and goes to the index; a wrong token answers
// 401 with the form again.
func (a *api) login(w http.ResponseWriter, req *http.Request) {
	if a.crossSite(w, req) {
		return
	}
	if err := req.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, "unreadable form", false)
		return
	}
	tok := strings.TrimSpace(req.PostForm.Get("token"))
	next := localPath(req.PostForm.Get("next"))
	if a.cfg.Tokens.Lookup(tok) == nil {
		a.metrics.denied.WithLabelValues("401").Inc()
		a.renderPage(w, http.StatusUnauthorized, "login", pageData{Title: "Sign in", Error: "unknown token", ReturnTo: next})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: tok, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: overHTTPS(req), MaxAge: 12 * 3600})
	http.Redirect(w, req, orRoot(next), http.StatusSeeOther)
}

// localPath is next when it is a path on this server ("/ui/outcomes?…"), else "": a sign-in must
// not send the reader to another site ("//evil.example", "https://…", "/\evil.example").
func localPath(next string) string {
	if len(next) > 2048 || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") ||
		strings.ContainsAny(next, "\\\r\n") {
		return ""
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil {
		return ""
	}
	return next
}

func orRoot(path string) string {
	if path == "" {
		return "/"
	}
	return path
}

func (a *api) logout(w http.ResponseWriter, req *http.Request) {
	if a.crossSite(w, req) {
		return
	}
	http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: "", Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: overHTTPS(req), MaxAge: -1})
	http.Redirect(w, req, "/login", http.StatusSeeOther)
}
