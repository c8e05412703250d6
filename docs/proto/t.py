import socket, os
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 7777)); s.listen()
c = socket.socket(); c.connect(("127.0.0.1", 7777)); a, _ = s.accept()
for name, sk in (("listener", s), ("accepted", a), ("client", c)):
    print(name, "WINDOW_CLAMP", sk.getsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP), "RCVBUF", sk.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF), "MAXSEG", sk.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG))
