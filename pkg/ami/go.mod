module github.com/fanpbx/fan/pkg/ami

go 1.26.0

require (
	github.com/fanpbx/fan/lab v0.0.0
	github.com/fanpbx/fan/pkg/events v0.0.0
	github.com/fanpbx/fan/pkg/platform v0.0.0
	github.com/staskobzar/goami2 v1.7.6
)

require github.com/google/uuid v1.6.0 // indirect

replace (
	github.com/fanpbx/fan/lab => ../../lab
	github.com/fanpbx/fan/pkg/events => ../events
)

replace github.com/fanpbx/fan/pkg/sipoptions => ../sipoptions

replace github.com/fanpbx/fan/pkg/platform => ../platform
