package phone

import (
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Digest authentication as Asterisk asks for it (RFC 2617 as RFC 3261
// §22.4 uses it): a 401 with WWW-Authenticate (or a 407 with
// Proxy-Authenticate) naming realm, nonce, opaque, algorithm MD5 and qop
// "auth"; the request is sent again with an Authorization (or
// Proxy-Authorization) whose response hashes the credentials with them.
// Asterisk 22 may offer SHA-256 beside MD5 in two headers: the phone
// answers the MD5 one, as most phones do.

// challenge is one Digest challenge's parameters.
type challenge struct {
	realm, nonce, opaque, algorithm string
	qops                            []string
}

var errNoChallenge = errors.New("no Digest challenge the phone can answer (MD5)")

// parseChallenges finds the first MD5 Digest challenge among values.
func parseChallenges(values []string) (challenge, error) {
	for _, v := range values {
		scheme, rest, _ := strings.Cut(strings.TrimSpace(v), " ")
		if !strings.EqualFold(scheme, "Digest") {
			continue
		}
		kv := authParams(rest)
		c := challenge{realm: kv["realm"], nonce: kv["nonce"], opaque: kv["opaque"], algorithm: kv["algorithm"]}
		if c.algorithm != "" && !strings.EqualFold(c.algorithm, "MD5") {
			continue
		}
		for _, q := range strings.Split(kv["qop"], ",") {
			if q = strings.TrimSpace(q); q != "" {
				c.qops = append(c.qops, strings.ToLower(q))
			}
		}
		if c.nonce == "" {
			continue
		}
		return c, nil
	}
	return challenge{}, errNoChallenge
}

// authParams reads `a="b", c=d` (quoted values may hold commas).
func authParams(s string) map[string]string {
	out := map[string]string{}
	for _, p := range splitList(s) {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = strings.ReplaceAll(v[1:len(v)-1], `\"`, `"`)
		}
		out[strings.ToLower(strings.TrimSpace(k))] = v
	}
	return out
}

func md5hex(s string) string {
	h := md5.Sum([]byte(s))
	return hex.EncodeToString(h[:])
}

// authorization answers c for method and uri. With qop "auth" offered it
// uses it (a client nonce and nonce count 1, the phone taking a fresh
// challenge for every request); without qop it gives RFC 2069's response.
func (c challenge) authorization(user, password, method, uri, cnonce string) string {
	ha1 := md5hex(user + ":" + c.realm + ":" + password)
	ha2 := md5hex(method + ":" + uri)
	qop := ""
	for _, q := range c.qops {
		if q == "auth" {
			qop = q
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `Digest username="%s", realm="%s", nonce="%s", uri="%s"`, user, c.realm, c.nonce, uri)
	if qop != "" {
		const nc = "00000001"
		resp := md5hex(ha1 + ":" + c.nonce + ":" + nc + ":" + cnonce + ":" + qop + ":" + ha2)
		fmt.Fprintf(&b, `, response="%s", cnonce="%s", qop=%s, nc=%s`, resp, cnonce, qop, nc)
	} else {
		fmt.Fprintf(&b, `, response="%s"`, md5hex(ha1+":"+c.nonce+":"+ha2))
	}
	b.WriteString(", algorithm=MD5")
	if c.opaque != "" {
		fmt.Fprintf(&b, `, opaque="%s"`, c.opaque)
	}
	return b.String()
}

// authorize adds to req the answer to the challenge in resp (401 or 407).
func authorize(req, resp *message, user, password string) error {
	challengeHeader, answerHeader := "www-authenticate", "authorization"
	if resp.status == 407 {
		challengeHeader, answerHeader = "proxy-authenticate", "proxy-authorization"
	}
	var values []string
	for _, h := range resp.headers {
		if h.name == challengeHeader {
			values = append(values, h.value)
		}
	}
	c, err := parseChallenges(values)
	if err != nil {
		return fmt.Errorf("%d to %s: %w", resp.status, req.method, err)
	}
	req.set(answerHeader, c.authorization(user, password, req.method, req.uri, randomHex(8)))
	return nil
}
