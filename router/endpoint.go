package router

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/kvrouterd/kvrouterd/wire"
)

// RankEndpoint is where one data-parallel rank of a worker publishes its KV events: its PUB
// socket and its replay socket ("" for none). A plain value.
type RankEndpoint struct {
	Rank     uint32
	Endpoint string
	Replay   string
}

// rankEndpoints returns the endpoints of g's ranks (distinct, ascending): g.Endpoint and
// g.Replay are those of its first rank, and the rank r ranks after it publishes on their port
// + r, as engines bind their data-parallel ranks' sockets. Nil when g names no endpoint.
func (g *Registration) rankEndpoints(ranks []uint32) ([]RankEndpoint, error) {
	if g.Endpoint == "" {
		return nil, nil
	}
	eps := make([]RankEndpoint, len(ranks))
	for i, rank := range ranks {
		off := rank - ranks[0]
		ep, err := offsetPort(g.Endpoint, off)
		if err != nil {
			return nil, fieldErr(ErrInvalid, "endpoint", "%v", err)
		}
		rp := ""
		if g.Replay != "" {
			if rp, err = offsetPort(g.Replay, off); err != nil {
				return nil, fieldErr(ErrInvalid, "replay_endpoint", "%v", err)
			}
		}
		if len(ep) > wire.MaxString || len(rp) > wire.MaxString {
			return nil, fieldErr(ErrTooLong, "endpoint", "rank %d's endpoint is over %d bytes", rank, wire.MaxString)
		}
		eps[i] = RankEndpoint{Rank: rank, Endpoint: ep, Replay: rp}
	}
	return eps, nil
}

// offsetPort returns endpoint with its port moved up by off: endpoint itself for 0, else a
// tcp://host:port endpoint's host with port + off.
func offsetPort(endpoint string, off uint32) (string, error) {
	if off == 0 {
		return endpoint, nil
	}
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	host, p, err := net.SplitHostPort(rest)
	port, perr := strconv.Atoi(p)
	if !ok || err != nil || perr != nil || port < 1 {
		return "", fmt.Errorf("%q: ranks after the first need a tcp://host:port endpoint (rank r publishes on port + r)", endpoint)
	}
	if uint64(port)+uint64(off) > 65535 {
		return "", fmt.Errorf("%q: port %d + %d ranks passes 65535", endpoint, port, off)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port+int(off))), nil
}
