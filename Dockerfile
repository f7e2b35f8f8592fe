# Builds the repeatrate binary into a small image. Used by docker-compose.yml and deploy/k8s.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/repeatrate ./cmd/repeatrate

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/repeatrate /repeatrate
EXPOSE 8080
ENTRYPOINT ["/repeatrate"]
CMD ["run"]
