package config

// PlaceholderMarks lets the fuzz target tell a placeholder from a value.
var PlaceholderMarks = placeholderMarks
