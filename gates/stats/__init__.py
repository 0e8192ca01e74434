"""The statistics the gates share: sequential detectors, fixed-sample bounds, descriptive
statistics, histogram arithmetic and the false-alarm budget."""
