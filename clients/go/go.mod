module github.com/sluice-dev/sluice/clients/go

go 1.22
