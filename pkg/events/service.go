package events

// ServiceRoot is the subject tree of fan's service discovery endpoints. It is
// deliberately outside EventRoot: a request there must never be captured by
// the audit stream, and outside CommandRoot so no executor consumes it.
const ServiceRoot = "fan.svc"

// ServiceStatusSubject is the request-reply status endpoint of one service
// instance (NATS micro, `nats micro info fan-<service>`). It names the node so
// that each instance answers for itself rather than sharing a queue group.
func ServiceStatusSubject(cluster, service, node string) string {
	return ServiceRoot + "." + cluster + "." + service + "." + node + ".status"
}

// AllServiceStatus matches every status endpoint of a cluster (permissions).
func AllServiceStatus(cluster string) string { return ServiceRoot + "." + cluster + ".>" }
