module github.com/fanpbx/fan/lab

go 1.26.0

require (
	github.com/fanpbx/fan/pkg/events v0.0.0
	github.com/miekg/dns v1.1.73
	github.com/nats-io/nats.go v1.55.0
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
)

require golang.org/x/net v0.60.0 // indirect

require (
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/nats-io/nkeys v0.4.16
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.58.0 // indirect
)

require (
	github.com/fanpbx/fan/pkg/platform v0.0.0
	github.com/fanpbx/fan/pkg/sipoptions v0.0.0
	github.com/google/uuid v1.6.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

replace github.com/fanpbx/fan/pkg/events => ../pkg/events

replace github.com/fanpbx/fan/pkg/sipoptions => ../pkg/sipoptions

replace github.com/fanpbx/fan/pkg/platform => ../pkg/platform
