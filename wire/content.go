package wire

// ContentType is the HTTP media type of bodies in this format.
const ContentType = "application/x-kvrouterd"
