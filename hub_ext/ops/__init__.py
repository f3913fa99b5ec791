"""Operations: the GPU board, usage reports, deployment steps, the hub's services and how it faces
the network.
"""
