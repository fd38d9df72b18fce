// Package usersv1 is the generated code of users.proto, the service of
// examples/grpcapi. Regenerate it with go generate (needs protoc and the
// plugins at the versions named in the generated files' headers):
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
package usersv1

//go:generate protoc -I ../../.. --go_out=../../.. --go_opt=paths=source_relative --go-grpc_out=../../.. --go-grpc_opt=paths=source_relative examples/grpcapi/usersv1/users.proto
