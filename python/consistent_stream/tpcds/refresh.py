RefreshCommit = RefreshResult = refresh_round = None
