module github.com/stockgate/stockgate/client

go 1.22
