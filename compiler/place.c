/* placeholder: being written */ typedef int ds4_placeholder_place;
