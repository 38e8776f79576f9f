module github.com/fanpbx/fan/pkg/sipoptions

go 1.26.0
