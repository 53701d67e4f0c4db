package radix

// NewHasherForTest returns a Hasher that takes the portable copying path when copyPath is set.
func NewHasherForTest(copyPath bool) *Hasher { return &Hasher{forceCopy: copyPath} }
