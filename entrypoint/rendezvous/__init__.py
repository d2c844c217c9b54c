"""rendezvous"""
